"""Supervised warm-up of a chat model on a task's demonstrations, before RL (`vapo-warmup`).

A small pretrained chat model may solve too few problems for a 0/1 reward to carry a signal, or never
call a tool it is told about. The usual remedy before RL is a short supervised fine-tune on worked
examples. Here each example is the task's own `demonstration(problem)` (the assistant turns of a
worked episode, e.g. one calculator call and the answer) played through the task's environment by
`scripted_episodes`, exactly as a rollout plays sampled turns: the same prompt, the same rendering of
the tools, the tool's real answers, the same tokens. The loss is the mean next-token NLL over the
model's own turns only (the action mask), never over the prompt or an observation.

Training is a Lightning `Trainer` run (automatic optimization, AdamW at a constant rate, gradient-norm
clipping, its precision and accelerator) over demonstrations drawn from the task's train problems;
the result is written with `save_pretrained` (model and tokenizer) beside `WARMUP.json`, which records
where it came from and the loss of every step. Eval problems are never demonstrated.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

WARMUP_FILE = "WARMUP.json"


@dataclass(frozen=True)
class WarmupSettings:
    demonstrations: int = 64
    """Distinct train problems demonstrated (drawn with the seed)."""
    steps: int = 32
    """Optimizer steps (batches drawn from the demonstrations, in seeded epochs)."""
    batch_size: int = 8
    """Demonstrations per step."""
    lr: float = 1e-5
    """AdamW learning rate (constant)."""
    grad_clip: float = 1.0
    """Gradient-norm clip."""
    seed: int = 0
    """Which problems, their order and the torch seed."""

    def check(self) -> "WarmupSettings":
        for name in ("demonstrations", "steps", "batch_size"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"--{name} must be an integer >= 1, got {value!r}")
        if not self.lr > 0 or not self.grad_clip > 0:
            raise ValueError(f"--lr and --grad_clip must be > 0, got {self.lr!r} and {self.grad_clip!r}")
        return self


def demonstration_rows(task, tokenizer, problems, *, max_new_tokens: int) -> list[dict]:
    """One training row per problem: `ids` (prompt + response tokens) and `targets` (1.0 on the
    model's own tokens), with the response `text` and the verifier's `reward` of it. ValueError when
    the task has no demonstrations or a demonstration does not score 1 (it would teach a wrong answer)."""
    from vapo_lit.engines.episodes import scripted_episodes
    from vapo_lit.rollout import prompt_ids

    if not callable(getattr(task, "demonstration", None)) or not getattr(task, "chat", False):
        raise ValueError(
            f"task {getattr(task, 'name', task)!r} has no chat demonstrations; a warm-up needs a chat task "
            "with a `demonstration(problem)` method (math_tools)"
        )
    scripts = [task.demonstration(p) for p in problems]
    played = scripted_episodes(
        task, tokenizer, [p.prompt for p in problems], scripts, max_new_tokens=max_new_tokens
    )
    verdicts = task.verify_batch(problems, [text for _, _, text in played])
    rows = []
    for p, (ids, action, text), verdict in zip(problems, played, verdicts):
        if verdict.reward != 1.0:
            raise ValueError(f"a demonstration scores {verdict.reward}, not 1: {text!r} (answer {p.answer})")
        prompt = prompt_ids(tokenizer, p.prompt)
        rows.append(
            {
                "ids": prompt + ids,
                "targets": [0.0] * len(prompt) + action,
                "text": text,
                "reward": verdict.reward,
            }
        )
    return rows


def _collate(rows: list[dict], pad: int):
    """Right-padded (ids, attention mask, loss mask) of a batch of rows."""
    import torch

    width = max(len(r["ids"]) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width))
    for i, r in enumerate(rows):
        n = len(r["ids"])
        ids[i, :n], mask[i, :n], loss_mask[i, :n] = torch.tensor(r["ids"]), 1, torch.tensor(r["targets"])
    return ids, mask, loss_mask


def _module(model, settings: WarmupSettings, log=None):
    import lightning as L
    import torch

    from vapo_lit.models.builtin import lm_loss

    class Warmup(L.LightningModule):
        """The warm-up's training step: the demonstrations' mean NLL over the model's own tokens."""

        def __init__(self):
            super().__init__()
            self.model = model
            self.losses: list[float] = []

        def training_step(self, batch, _index):
            ids, mask, loss_mask = batch
            loss = lm_loss(self.model, ids, mask, loss_mask, loss_mask[:, 1:].sum())
            self.losses.append(float(loss.detach()))
            step = len(self.losses)
            if log is not None and (step % max(1, settings.steps // 8) == 0 or step == settings.steps):
                log(f"vapo-warmup: step {step}/{settings.steps} loss {self.losses[-1]:.4f}")
            self.log("warmup/loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.model.parameters(), lr=settings.lr, weight_decay=0.0)

    return Warmup()


def _batches(rows: list[dict], settings: WarmupSettings, pad: int) -> list:
    """`settings.steps` batches: seeded shuffles of the rows, one epoch after another."""
    rng = random.Random(f"vapo-lit/warmup/{settings.seed}")
    order: list[int] = []
    while len(order) < settings.steps * settings.batch_size:
        epoch = list(range(len(rows)))
        rng.shuffle(epoch)
        order += epoch
    size = settings.batch_size
    return [_collate([rows[i] for i in order[k * size : (k + 1) * size]], pad) for k in range(settings.steps)]


def warm_up(cfg, settings: WarmupSettings, out: str | Path, *, log=print) -> dict:
    """Fine-tune `cfg.model` (a local chat model folder) on `cfg.task`'s demonstrations and save it to
    `out` (which must not exist); returns what WARMUP.json records."""
    import lightning as L
    import torch

    from vapo_lit.build import task_options_of
    from vapo_lit.devices import resolve_accelerator, resolve_precision
    from vapo_lit.models import load_policy
    from vapo_lit.models.quiet import quiet_transformers
    from vapo_lit.tasks import get_task

    settings.check()
    out = check_out(out)
    task = get_task(cfg.task, **task_options_of(cfg))
    model, tokenizer = load_policy(cfg.model, task, dtype=cfg.model_dtype)
    budget = cfg.ppo.max_new_tokens or task.max_new_tokens
    problems = task.train_problems(settings.demonstrations, seed=settings.seed)
    rows = demonstration_rows(task, tokenizer, problems, max_new_tokens=budget)
    log(f"vapo-warmup: {len(rows)} demonstrations, e.g. {rows[0]['text']!r}")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    torch.manual_seed(settings.seed)
    module = _module(model, settings, log)
    accelerator = resolve_accelerator(cfg.accelerator)
    trainer = L.Trainer(
        max_steps=settings.steps,
        max_epochs=1,
        gradient_clip_val=settings.grad_clip,
        accelerator=accelerator,
        devices=1,
        precision=resolve_precision(cfg.precision, accelerator),
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    model.train()
    batches = _batches(rows, settings, pad)  # already collated: the loader hands them over as they are
    trainer.fit(
        module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False)
    )
    model.eval()
    record = {
        "base_model": str(cfg.model),
        "task": cfg.task,
        "task_options": dict(cfg.task_options),
        "max_new_tokens": budget,
        "settings": asdict(settings),
        "example": rows[0]["text"],
        "loss": module.losses,
    }
    partial = out.with_name(f".{out.name}.partial")  # written whole, then moved into place
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with quiet_transformers():
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
    (partial / WARMUP_FILE).write_text(json.dumps(record, indent=2) + "\n")
    partial.rename(out)
    return record


def check_out(out: str | Path) -> Path:
    """`out` as a Path; ValueError when it exists (a warm-up never writes over a model)."""
    out = Path(out)
    if out.exists():
        raise ValueError(f"--out {out}: exists; name a new folder (a warm-up never writes over one)")
    return out
