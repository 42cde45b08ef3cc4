"""`train(cfg)`: build task, models, module, component callbacks and loggers; fit; return a summary.

This is the one entry that `vapo-train`, the ablation runner and the tests call. A run folder
holds `metrics.csv` (every logged metric, one row per iteration), `run_card.json` (SPEC.md's
"a run must record" list), `config.yaml`, `checkpoints/last.ckpt` and `best.ckpt`, and the W&B
run under `wandb/`.
"""
from __future__ import annotations

import csv
import json
import netrc
import os
import random
import time
import warnings
from pathlib import Path
from urllib.parse import urlparse

import lightning as L
import torch
import yaml
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger

from vapo_lit.components import build_callbacks
from vapo_lit.config import COMPONENTS, RunConfig, run_label, to_dict, validate
from vapo_lit.module import VapoModule


# ----------------------------------------------------------------------------- run naming
def run_dir_of(cfg: RunConfig) -> Path:
    return Path(cfg.out_dir) / (cfg.name or f"{run_label(cfg.components, cfg.advantage_estimator)}-s{cfg.seed}")


# ----------------------------------------------------------------------------- loggers
class ResumableCSVLogger(CSVLogger):
    """CSVLogger that, on resume, keeps the rows up to the checkpoint instead of deleting the file
    (Lightning's writer removes an existing metrics.csv) and appends from there."""

    def __init__(self, save_dir, keep_until_step: int | None = None):
        super().__init__(save_dir=str(save_dir), name="", version="")
        self._keep_until = keep_until_step

    @property
    def experiment(self):
        if self._experiment is None:
            path = Path(self.log_dir) / "metrics.csv"
            kept, header = [], []
            if self._keep_until is not None and path.is_file():
                with open(path, newline="") as f:
                    reader = csv.DictReader(f)
                    header = list(reader.fieldnames or [])
                    kept = [row for row in reader if int(float(row["step"])) <= self._keep_until]
            exp = super().experiment
            if header:
                with open(path, "w", newline="") as f:
                    w = csv.DictWriter(f, fieldnames=header)
                    w.writeheader()
                    w.writerows(kept)
                exp.metrics_keys = list(header)
        return self._experiment


def wandb_mode(choice: str) -> str:
    """auto: online when the user is logged in (WANDB_API_KEY or a netrc entry), else offline."""
    if choice != "auto":
        return choice
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        if host and netrc.netrc().authenticators(host):
            return "online"
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        pass
    return "offline"


def make_wandb_logger(cfg: RunConfig, run_dir: Path, card: dict, run_id: str | None):
    mode = wandb_mode(cfg.wandb)
    if mode == "disabled":
        return None
    from lightning.pytorch.loggers import WandbLogger

    dropped = [c for c in COMPONENTS if c not in cfg.components]
    return WandbLogger(
        name=run_dir.name, project=cfg.wandb_project, group=cfg.wandb_group or run_dir.name,
        job_type=cfg.wandb_job_type or run_label(cfg.components, cfg.advantage_estimator),
        tags=[f"no-{c}" for c in dropped] + [f"seed-{cfg.seed}"], save_dir=str(run_dir), mode=mode,
        id=run_id, resume="allow" if run_id else None, config=card, log_model=False,
    )


# ----------------------------------------------------------------------------- checkpoints
class RunCheckpoints(Callback):
    """last.ckpt every `checkpoint_every` iterations and at the end; best.ckpt on a new best eval.
    Written to a temporary file and renamed, so a kill never leaves a half-written checkpoint."""

    def __init__(self, run_dir: Path, every: int):
        self.dir = Path(run_dir) / "checkpoints"
        self.every = every

    def _save(self, trainer, name: str) -> str:
        self.dir.mkdir(parents=True, exist_ok=True)
        final = self.dir / name
        tmp = self.dir / f".{name}.tmp"
        trainer.save_checkpoint(str(tmp), weights_only=False)  # full state: optimizers, schedulers, callbacks
        os.replace(tmp, final)
        return str(final)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if pl_module.last_metrics.get("eval/is_best"):
            self._save(trainer, "best.ckpt")
        if pl_module.iteration % self.every == 0 or trainer.should_stop:
            pl_module.last_good_checkpoint = self._save(trainer, "last.ckpt")


# ----------------------------------------------------------------------------- run card
def run_card(cfg: RunConfig, module: VapoModule) -> dict:
    """Everything SPEC.md says a run must record, with this project's answers."""
    sw, p = module.switches, cfg.ppo
    task = module.task
    return {
        "config": to_dict(cfg),
        "components_on": [c for c in COMPONENTS if c in cfg.components],
        "components_off": [c for c in COMPONENTS if c not in cfg.components],
        "switches": to_dict(sw),
        "value_initialisation_and_warmup": {
            "critic_init": cfg.critic_init,
            "value_pretraining": sw.value_pretraining,
            "warmup_steps_max": sw.value_pretrain_steps if sw.value_pretraining else 0,
            "warmup_stop_min_ev": sw.value_pretrain_min_ev if sw.value_pretraining else None,
            "warmup_data": "fresh rollouts of the frozen initial policy from the training prompt stream, "
                           "Monte-Carlo returns (lambda = 1), critic-only updates",
        },
        "update_frequencies": {
            "actor_updates_per_iteration": (p.responses_per_step // p.mini_batch_size) * p.ppo_epochs,
            "critic_updates_per_iteration": (p.responses_per_step // p.mini_batch_size) * p.critic_epochs,
            "order": "critic then actor, on the same rollout, advantages computed before either update",
        },
        "lambdas": {
            "lambda_policy": f"1 - 1/({sw.alpha} * l), clamped to [0, 1]" if sw.length_adaptive_gae else p.lam,
            "lambda_critic": sw.lambda_critic if sw.decoupled_gae else "same as lambda_policy",
            "length_definition": "number of valid response tokens (EOS included) of that response",
            "gamma": p.gamma,
        },
        "masks": {
            "terminal": "response ended with EOS: no value after the last token (bootstrap 0)",
            "truncated": "response hit max_new_tokens: bootstrapped from V(state after the last token)",
            "padding": "no TD residual; interior zeros are skipped as if cut out",
        },
        "token_denominator": (
            "token-level: valid tokens of the whole mini-batch (summed over micro-batches)"
            if sw.token_level_loss else
            "sample-level: mean over each response's tokens, then over the mini-batch's responses"
        ),
        "packed_batch_semantics": "no packing: one response per row, left-padded prompt, right-padded response",
        "positive_samples": {
            "rule": "verifier reward == 1",
            "nll_coefficient": sw.mu if sw.positive_lm_loss else 0.0,
            "nll_denominator": "positive tokens of the mini-batch; exactly 0 with none",
        },
        "rollout_budget": {
            "prompts_per_step": module.prompts_per_step,
            "samples_per_prompt": module.samples_per_prompt,
            "responses_per_step": p.responses_per_step,
            "max_new_tokens": module.max_new_tokens,
            "total_rollout_tokens": "see rollout/response_length x responses_per_step in metrics.csv",
        },
        "sampling": {
            "temperature": p.temperature, "top_p": p.top_p,
            "behaviour_logprobs": "recorded at sampling time: log softmax(logits / temperature) of the sampled "
                                  "token, before top-p truncation (KV-cached generation)",
            "eval": {"k": cfg.eval_k, "temperature": cfg.eval_temperature, "top_p": cfg.eval_top_p},
        },
        "verifier": {
            "task": cfg.task, "version": getattr(task, "version", "?"),
            "failures": "an exception or timeout inside the verifier scores 0 and is counted apart as "
                        "rollout/verifier_errors",
        },
        "eps": {"eps_low": p.eps, "eps_high": sw.eps_high if sw.clip_higher else p.eps},
        "advantage_normalisation": "actor advantages whitened over valid tokens" if p.whiten_advantages else "none",
        "software": {"torch": torch.__version__, "lightning": L.__version__},
    }


class RunCardWriter(Callback):
    """Writes run_card.json once the component callbacks have set the switches."""

    def __init__(self, run_dir: Path, extra: dict):
        self.run_dir, self.extra = Path(run_dir), extra

    def on_fit_start(self, trainer, pl_module) -> None:
        card = run_card(pl_module.cfg, pl_module)
        card.update(self.extra)
        for lg in trainer.loggers:
            if type(lg).__name__ == "WandbLogger":
                card["wandb"] = {"id": lg.version, "project": pl_module.cfg.wandb_project,
                                 "group": pl_module.cfg.wandb_group or self.run_dir.name,
                                 "mode": lg.experiment.settings.mode}
                lg.experiment.config.update({"run_card": card}, allow_val_change=True)
        _write_json(self.run_dir / "run_card.json", card)


def _write_json(path: Path, data) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- train
def build_module(cfg: RunConfig) -> VapoModule:
    """Task, policy and critic as the config names them (no critic for the critic-free estimator).

    `model: random` is an untrained tiny Llama on the task's tokenizer with a critic on a copy of
    its backbone: seconds to build, for smoke runs and tests of the machinery (it learns nothing)."""
    from vapo_lit.models import load_critic, load_policy
    from vapo_lit.models.value import ValueModel
    from vapo_lit.tasks import get_task

    options = dict(cfg.task_options)
    if cfg.model not in ("builtin", "random") and "tokenizer" not in options and _accepts(cfg.task, "tokenizer"):
        options["tokenizer"] = cfg.model  # a task on your own model uses that model's tokenizer
    task = get_task(cfg.task, **options)
    if cfg.model == "random":
        actor, tokenizer = random_tiny_policy(task, cfg.seed)
        critic = ValueModel.from_causal_lm(actor)
    else:
        actor, tokenizer = load_policy(cfg.model, task, seed=cfg.model_seed, cache_dir=cfg.cache_dir)
        critic = load_critic(cfg.critic_init, task, policy_spec=cfg.model, seed=cfg.model_seed,
                             cache_dir=cfg.cache_dir)
    if cfg.advantage_estimator == "grpo":
        critic = None
    return VapoModule(cfg, task, actor, tokenizer, critic)


def _accepts(task_name: str, param: str) -> bool:
    import inspect

    from vapo_lit.tasks import TASKS, task_names

    task_names()  # loads the built-in tasks
    factory = TASKS.get(task_name)
    return factory is not None and param in inspect.signature(factory).parameters


def random_tiny_policy(task, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = task.tokenizer
    torch.manual_seed(seed)
    mc = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return LlamaForCausalLM(mc), tok


def train(cfg: RunConfig, *, resume: bool = False, extra_callbacks=(), module_factory=build_module) -> dict:
    """Run (or, with resume=True, continue) one training run; returns its summary.

    `module_factory(cfg) -> VapoModule` builds task and models (tests pass tiny ones)."""
    validate(cfg)
    run_dir = run_dir_of(cfg)
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    if resume and not ckpt.is_file():
        raise FileNotFoundError(f"cannot resume: no checkpoint at {ckpt}")
    if not resume and (run_dir / "metrics.csv").exists():
        raise FileExistsError(
            f"{run_dir} already holds a run; pass --resume to continue it or choose another --name/--out_dir"
        )
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))

    keep_until = None
    wandb_id = None
    if resume:
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        keep_until = state["vapo"]["iteration"]
        if state["vapo"]["ppo_updates"] >= cfg.steps and (run_dir / "summary.json").is_file():
            return json.loads((run_dir / "summary.json").read_text())  # finished: nothing to resume
        card_path = run_dir / "run_card.json"
        if card_path.is_file():
            wandb_id = json.loads(card_path.read_text()).get("wandb", {}).get("id")
    module = module_factory(cfg)
    loggers = [ResumableCSVLogger(run_dir, keep_until_step=keep_until if resume else None)]
    wb = make_wandb_logger(cfg, run_dir, {"config": to_dict(cfg)}, wandb_id)
    if wb is not None:
        loggers.append(wb)
    callbacks = [*build_callbacks(cfg.components, cfg.vapo), RunCheckpoints(run_dir, cfg.checkpoint_every),
                 RunCardWriter(run_dir, {"run_dir": str(run_dir)}), *extra_callbacks]
    trainer = L.Trainer(
        accelerator="cpu" if not torch.cuda.is_available() else "auto", devices=1, max_epochs=-1, max_steps=-1,
        logger=loggers, callbacks=callbacks, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=1, default_root_dir=str(run_dir),
    )
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*does not have many workers.*")
            warnings.filterwarnings("ignore", ".*IterableDataset.*__len__.*")
            # ResumableCSVLogger keeps the rows up to the checkpoint itself; Lightning's generic
            # "previous log files will be deleted" warning does not apply to it.
            warnings.filterwarnings("ignore", ".*Experiment logs directory .* exists and is not empty.*")
            # Models stay in eval mode on purpose: no dropout, so the PPO ratio compares the policy
            # with itself and the recorded behaviour log-probs are reproducible.
            warnings.filterwarnings("ignore", ".*module\\(s\\) in eval mode.*")
            trainer.fit(module, ckpt_path=str(ckpt) if resume else None)
    except BaseException:
        if wb is not None and wb._experiment is not None:
            wb.experiment.finish(exit_code=1)  # keep what was logged; mark the run failed
        raise
    summary = {
        "run_dir": str(run_dir), "iterations": module.iteration, "ppo_updates": module.ppo_updates,
        "best_eval": module.best_eval, "wall_seconds": time.perf_counter() - t0,
        "last_metrics": module.last_metrics,
    }
    _write_json(run_dir / "summary.json", summary)
    if wb is not None:
        wb.experiment.finish()  # flush and close this run's file now (not at interpreter exit)
    return summary
