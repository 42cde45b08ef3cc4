"""One RL step side by side: ours (VapoModule), the plain way, and TRL 1.12's PPO, in one run.

    python benchmarks/step.py                 # the issue's shape: 64 x 96 tokens, 2 mini-batches of 32
    python benchmarks/step.py --reps 18       # more interleaved repetitions
    python benchmarks/step.py --quick         # 8 responses x 8 tokens, one repetition (a smoke run)
    python benchmarks/step.py --long --reps 3 --warmup 1   # and VAPO's regime, 32 x 1,024 tokens, in the same run
    python benchmarks/step.py --sides ours,plain --profile /tmp/prof   # cProfile of each side's timed steps

Every side runs in its own process (one torch thread each, float32, CPU) on the same model: a
random Llama built from a `LlamaConfig` on the built-in chain task's tokenizer (nothing is
downloaded), whose output layer carries a fixed -1e9 logit on EOS and on the pad token, so every
response of every side is exactly `--tokens` tokens long and every side samples from and trains
the same distribution. Prompts are the chain task's (5 tokens each, `--responses /
--samples-per-prompt` problems x `--samples-per-prompt` copies; each side draws its own, the
content does not change the cost). The parent process sends "step" to one side at a time, in an
order that rotates every repetition, and collects each side's own timing of that step.

* ``ours``  -- vapo-lit itself: `vapo_lit.train.train` with a module factory that builds a
  `VapoModule` on the model above; the `default` preset's recipe (decoupled and length-adaptive
  GAE, token-level loss, Clip-Higher, positive NLL, group sampling: `--responses` /
  `--samples-per-prompt` prompts x `--samples-per-prompt` samples) without value pretraining (a
  phase before PPO that makes the first iterations critic-only): actor lr 5e-5, critic lr 1e-3,
  alpha 1, eps_high 0.28, mu 0.1, gradient clipping 1.0, temperature 1, top-p 1. A step is one
  `training_step` with everything Lightning does between two of them (wall time from the previous
  step's end), the CSV log row included; no eval and no checkpoint falls in a timed step, W&B is off.
* ``plain`` -- the same algorithm written the plain way (the functions below): HF `generate`
  (behaviour log-probs from its scores), padded full-length forward passes for the values and
  the updates, the reverse-loop GAE (once per lambda), plain masked whitening, the same verifier,
  the same mini- and micro-batches, AdamW and gradient clipping.
* ``trl``   -- `trl.experimental.ppo.PPOTrainer` (trl 1.12, the `[bench]` extra; skipped with the
  reason when it is not installed) on the same model, with `per_device_train_batch_size =
  --responses`, `gradient_accumulation_steps = 1` and `num_mini_batches = responses / mini-batch`:
  the same responses per step and one optimizer step per mini-batch, as ours (TRL's micro-batch is
  its per-device batch, so it always runs micro-batch = mini-batch). A step is one
  iteration of its training loop (between two `on_step_end` callbacks). TRL does work that VAPO
  does not need and that it cannot switch off: a reference-model forward (KL penalty), a
  reward-model forward (a `LlamaForSequenceClassification` of the same size, standing in for our
  verifier) and two `gc.collect()` per step. Its actor and critic update in one joint forward and
  backward with one optimizer, without gradient clipping.

Printed: seconds per step and generated tokens per second (median [min-max] over the timed
repetitions), each side's split of its step (rollout, verifier or reward model, reference
forward, values, advantages, critic update, actor update, gc.collect, the rest) with the ratio
to ours, the ceiling a rollout that took no time would give (each other side's median step over
ours minus our rollout: the passes after the rollout are the same matrix products on every side),
and as the last line ``speedup vs plain: X.XXx; vs TRL: Y.YYx`` (median step time of the other
side / ours) for the shape given. `--long` then also runs 32 responses x 1,024 tokens (mini-batch
16, micro-batch 8) with fresh workers, prints its tables, and its speedups on the line before the last. The split is measured by wrapping each side's stages in this script
(`ours`: `VapoModule.rollout`, the task's verifier, `fill_values`, `fill_advantages`,
`update_critic`, `update_actor`; nothing in vapo_lit is changed).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

SIDES = ("ours", "plain", "trl")
SUPPRESSED = -1e9
"""Logit of the suppressed tokens (EOS, pad): finite, so entropies stay finite (0 * -1e9 = 0)."""


# ============================================================================ the shared model
class SuppressedTokensHead(torch.nn.Linear):
    """The LM head with a fixed logit of -1e9 on `suppressed` ids (a buffer, not trained): no
    side ever samples them, so every response runs to max_new_tokens, and every side's training
    pass sees the same distribution the sampler drew from."""

    def __init__(self, head: torch.nn.Linear, suppressed: list[int]):
        super().__init__(head.in_features, head.out_features, bias=False)
        self.weight = head.weight
        bias = torch.zeros(head.out_features, dtype=head.weight.dtype)
        bias[suppressed] = SUPPRESSED
        self.register_buffer("logit_bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight) + self.logit_bias.to(x.dtype)


def llama_config(args, tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        intermediate_size=args.intermediate,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_policy(args, tokenizer):
    """The random Llama every side starts from (seeded by --seed), EOS and pad suppressed."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(llama_config(args, tokenizer))
    model.lm_head = SuppressedTokensHead(model.lm_head, [tokenizer.eos_token_id, tokenizer.pad_token_id])
    return model.eval()


def build_critic(policy, seed: int):
    """vapo-lit's critic: a copy of the policy's backbone with a fresh scalar head."""
    from vapo_lit.models.value import ValueModel

    with torch.random.fork_rng():
        torch.manual_seed(seed + 1)
        return ValueModel.from_causal_lm(policy).eval()


def chain_task():
    from vapo_lit.tasks import get_task

    return get_task("chain")


def prompts_of_step(task, args, step: int):
    """The step's problems: responses / k prompts, each repeated k times (adjacent), as ours samples."""
    k = args.samples_per_prompt
    problems = task.train_problems(args.responses // k, seed=10_000 + step)
    return [p for p in problems for _ in range(k)]


# ============================================================================ the plain way
def plain_encode(tokenizer, prompts: list[str]):
    """(ids, attention mask), left-padded, with the tokenizer's special tokens."""
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


@torch.no_grad()
def plain_generate(
    actor,
    ids,
    attn,
    *,
    max_new_tokens: int,
    temperature: float,
    pad_id: int,
    eos_id: int,
    greedy: bool = False,
):
    """HF `generate`: (responses (N, R), behaviour log-probs (N, R) from its scores, before any cut)."""
    out = actor.generate(
        input_ids=ids,
        attention_mask=attn,
        do_sample=not greedy,
        temperature=temperature if not greedy else None,
        top_k=0 if not greedy else None,
        top_p=1.0 if not greedy else None,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        output_scores=True,
        return_dict_in_generate=True,
    )
    responses = out.sequences[:, ids.shape[1] :]
    scores = torch.stack(out.scores, 1).float()  # (N, R, V): logits / T
    logp = torch.log_softmax(scores, -1).gather(-1, responses[..., None]).squeeze(-1)
    return responses, logp


def plain_response_mask(responses, eos_id: int):
    """(N, R) 1.0 up to and including the first EOS."""
    is_eos = (responses == eos_id).long()
    after = is_eos.cumsum(1) - is_eos  # EOS tokens strictly before this column
    return (after == 0).float()


def plain_positions(attn):
    return (attn.long().cumsum(-1) - 1).clamp(min=0)


def plain_logprobs(actor, ids, attn, prompt_width: int, responses, temperature: float, entropy: bool = False):
    """One padded full-length forward: log pi(y_t) of the response tokens (N, R) and their entropy."""
    logits = actor(input_ids=ids, attention_mask=attn, position_ids=plain_positions(attn)).logits
    logits = logits[:, prompt_width - 1 : -1].float() / temperature
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, responses[..., None]).squeeze(-1)
    ent = None
    if entropy:
        with torch.no_grad():
            ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp, ent


def plain_values(critic, ids, attn, prompt_width: int):
    """One padded full-length critic forward: V(s_t) before each response token (N, R)."""
    h = critic.backbone(
        input_ids=ids, attention_mask=attn, position_ids=plain_positions(attn)
    ).last_hidden_state
    return critic.head(h).squeeze(-1)[:, prompt_width - 1 : -1]


def reverse_gae(rewards, values, mask, lam, gamma: float = 1.0):
    """GAE by the textbook reverse loop over columns; `lam` a float or (N,). Terminal rows: no
    value after the last token. Returns advantages (N, R), 0 on padding."""
    N, R = rewards.shape
    lam = torch.as_tensor(lam, dtype=values.dtype).expand(N)
    adv = torch.zeros_like(values)
    last = torch.zeros(N, dtype=values.dtype)
    for t in reversed(range(R)):
        next_v = values[:, t + 1] * mask[:, t + 1] if t + 1 < R else torch.zeros(N, dtype=values.dtype)
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        last = (delta + gamma * lam * last) * mask[:, t]
        adv[:, t] = last
    return adv


def plain_whiten(x, mask, eps: float = 1e-8):
    """(x - mean) / std over the valid tokens (population variance), 0 on padding."""
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = (((x - mean) ** 2) * mask).sum() / n
    return (x - mean) * torch.rsqrt(var + eps) * mask


def plain_policy_loss(logp, old_logp, adv, mask, positive, *, eps_low, eps_high, mu, den, pos_den):
    """Token-level clipped surrogate (Clip-Higher) + mu * NLL of the correct responses; (loss, pg, nll)."""
    ratio = torch.exp(logp - old_logp)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - eps_low, 1 + eps_high) * adv)
    pg = -(surrogate * mask).sum() / den
    pos_mask = mask * positive[:, None].float()
    nll = -(logp * pos_mask).sum() / pos_den if pos_den > 0 else torch.zeros(())
    return pg + mu * nll, pg, nll


def plain_value_loss(v, returns, mask, den):
    return 0.5 * (((v - returns) ** 2) * mask).sum() / den


class PlainPPO:
    """The whole step, the plain way: same algorithm, batch and optimizer settings as ours."""

    def __init__(self, args, task, actor, critic):
        from vapo_lit.config import RunConfig, merge
        from vapo_lit.presets import PRESETS

        preset = merge(RunConfig(), PRESETS["default"])
        self.p, self.v = preset.ppo, preset.vapo
        self.args, self.task, self.actor, self.critic = args, task, actor, critic
        self.tok = task.tokenizer
        warm = max(1, self.p.warmup_steps)
        self.opts = {}
        for name, model, lr in (("actor", actor, self.p.actor_lr), ("critic", critic, self.p.critic_lr)):
            opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=self.p.weight_decay)
            self.opts[name] = (
                opt,
                torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm)),
            )
        self.step_index = 0

    def minibatches(self, n: int, salt: int):
        g = torch.Generator().manual_seed(self.args.seed * 7919 + self.step_index * 31 + salt)
        perm = torch.randperm(n, generator=g)
        mb, micro = self.args.mini_batch, self.args.micro_batch
        for s in range(0, n, mb):
            idx = perm[s : s + mb]
            yield idx, [idx[k : k + micro] for k in range(0, len(idx), micro)]

    def step(self, timer) -> dict:
        a, p, tok = self.args, self.p, self.tok
        problems = prompts_of_step(self.task, a, self.step_index)
        with timer("rollout"):
            ids, attn = plain_encode(tok, [pr.prompt for pr in problems])
            responses, old_logp = plain_generate(
                self.actor,
                ids,
                attn,
                max_new_tokens=a.tokens,
                temperature=p.temperature,
                pad_id=tok.pad_token_id,
                eos_id=tok.eos_token_id,
            )
            mask = plain_response_mask(responses, tok.eos_token_id)
            lengths = mask.sum(1).long()
            texts = tok.batch_decode(
                [r[:n].tolist() for r, n in zip(responses, lengths)], skip_special_tokens=True
            )
        with timer("verifier"):
            scores = torch.tensor([v.reward for v in self.task.verify_batch(problems, texts)])
        P, N = ids.shape[1], len(problems)
        full = torch.cat([ids, torch.where(mask.bool(), responses, tok.pad_token_id)], 1)
        full_attn = torch.cat([attn, mask.long()], 1)
        old_logp = old_logp * mask
        with timer("values"), torch.no_grad():
            values = plain_values(self.critic, full, full_attn, P) * mask
        with timer("advantages"):
            rewards = torch.zeros_like(values)
            rewards[torch.arange(N), lengths - 1] = scores
            lam_policy = (1 - 1 / (self.v.alpha * lengths.float())).clamp(0, 1)
            adv = reverse_gae(rewards, values, mask, lam_policy, p.gamma)
            returns = reverse_gae(rewards, values, mask, self.v.lambda_critic, p.gamma) + values * mask
            adv = plain_whiten(adv, mask)
        with timer("critic update"):
            v_losses = self.update_critic(full, full_attn, P, returns, mask)
        with timer("actor update"):
            stats = self.update_actor(full, full_attn, P, responses, old_logp, adv, mask, scores > 0)
        self.step_index += 1
        stats.update({"value_loss": sum(v_losses) / len(v_losses), "score": float(scores.mean())})
        return {
            "tokens": int(mask.sum()),
            "min_len": int(lengths.min()),
            "max_len": int(lengths.max()),
            "stats": stats,
        }

    def update_critic(self, full, attn, P, returns, mask) -> list[float]:
        opt, sch = self.opts["critic"]
        losses = []
        for idx, micros in self.minibatches(len(full), salt=10):
            den = mask[idx].sum()
            total = 0.0
            for mi in micros:
                loss = plain_value_loss(
                    plain_values(self.critic, full[mi], attn[mi], P), returns[mi], mask[mi], den
                )
                loss.backward()
                total += loss.item()
            torch.nn.utils.clip_grad_norm_(self.critic.parameters(), self.p.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sch.step()
            losses.append(total)
        return losses

    def update_actor(self, full, attn, P, responses, old_logp, adv, mask, positive) -> dict:
        opt, sch = self.opts["actor"]
        sums = defaultdict(float)
        for idx, micros in self.minibatches(len(full), salt=20):
            den, pos_den = mask[idx].sum(), (mask[idx] * positive[idx, None]).sum()
            for mi in micros:
                logp, ent = plain_logprobs(
                    self.actor, full[mi], attn[mi], P, responses[mi], self.p.temperature, entropy=True
                )
                loss = plain_policy_loss(
                    logp,
                    old_logp[mi],
                    adv[mi],
                    mask[mi],
                    positive[mi],
                    eps_low=self.p.eps,
                    eps_high=self.v.eps_high,
                    mu=self.v.mu,
                    den=den,
                    pos_den=pos_den,
                )[0]
                loss.backward()
                with torch.no_grad():
                    m = mask[mi]
                    ratio = torch.exp(logp - old_logp[mi])
                    sums["loss"] += loss.item()
                    sums["entropy"] += float((ent * m).sum() / m.sum())
                    sums["clipfrac"] += float(((ratio - 1).abs() > self.p.eps).float().mul(m).sum() / m.sum())
            torch.nn.utils.clip_grad_norm_(self.actor.parameters(), self.p.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sch.step()
        return dict(sums)


# ============================================================================ worker processes
class Timer:
    """Seconds per named part of one step; `timed(name, fn)` wraps a callable."""

    def __init__(self, profile_path: str | None = None):
        self.parts: dict[str, float] = defaultdict(float)
        self.t0 = 0.0
        self.extra: dict = {}
        self.profiler = None
        self.profile_path = profile_path
        if profile_path:
            import cProfile

            self.profiler = cProfile.Profile()

    def start(self) -> None:
        self.parts, self.extra = defaultdict(float), {}
        if self.profiler:
            self.profiler.enable()
        self.t0 = time.perf_counter()

    def finish(self) -> dict:
        seconds = time.perf_counter() - self.t0
        if self.profiler:
            self.profiler.disable()
        return {"seconds": seconds, "split": dict(self.parts), **self.extra}

    def __call__(self, name: str):
        timer = self

        class _Part:
            def __enter__(self):
                self.t = time.perf_counter()

            def __exit__(self, *exc):
                timer.parts[name] += time.perf_counter() - self.t

        return _Part()

    def timed(self, name: str, fn, after=None):
        def wrapper(*a, **k):
            t = time.perf_counter()
            out = fn(*a, **k)
            self.parts[name] += time.perf_counter() - t
            if after is not None:
                after(out, *a, **k)
            return out

        return wrapper


class Link:
    """The worker's side of the protocol: JSON lines out on the original stdout (everything else
    printed goes to stderr), one command per line in ("step" or "quit")."""

    def __init__(self, timer: Timer):
        self.timer = timer
        self.out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)

    def send(self, obj: dict) -> None:
        self.out.write(json.dumps(obj) + "\n")
        self.out.flush()

    def wait(self) -> None:
        """Block until the parent says "step" (the timer then starts), or exit on "quit"."""
        cmd = sys.stdin.readline().strip()
        if cmd != "step":
            if self.timer.profiler:
                self.timer.profiler.dump_stats(self.timer.profile_path)
            self.out.flush()
            os._exit(0)
        self.timer.start()

    def done(self) -> None:
        self.send(self.timer.finish())


def worker_plain(args, link: Link, timer: Timer) -> None:
    task = chain_task()
    actor = build_policy(args, task.tokenizer)
    plain = PlainPPO(args, task, actor, build_critic(actor, args.seed))
    link.send(
        {
            "ready": True,
            "params": sum(p.numel() for p in actor.parameters()),
            "critic_params": sum(p.numel() for p in plain.critic.parameters()),
        }
    )
    while True:
        link.wait()
        timer.extra.update(plain.step(timer))
        link.done()


def ours_config(args, out_dir: str):
    from vapo_lit.config import COMPONENTS, RunConfig, merge
    from vapo_lit.presets import PRESETS

    components = [c for c in COMPONENTS if c != "value_pretraining"]
    if args.samples_per_prompt == 1:
        components.remove("group_sampling")
    return merge(
        merge(RunConfig(), PRESETS["default"]),
        {
            "components": components,
            "model": "random",
            "seed": args.seed,
            "ppo": {
                "responses_per_step": args.responses,
                "mini_batch_size": args.mini_batch,
                "micro_batch_size": args.micro_batch,
                "max_new_tokens": args.tokens,
                "ppo_epochs": 1,
                "critic_epochs": 1,
            },
            "vapo": {"samples_per_prompt": max(args.samples_per_prompt, 2)},
            "steps": 10**9,
            "eval_every": 0,
            "eval_k": 1,
            "eval_problems": 1,
            "checkpoint_every": 10**9,
            "wandb": "disabled",
            "threads": 1,
            "accelerator": "cpu",
            "precision": "32-true",
            "out_dir": out_dir,
            "name": "ours",
        },
    )


def worker_ours(args, link: Link, timer: Timer) -> None:
    import lightning as L

    import vapo_lit.module as vapo_module
    from vapo_lit.module import VapoModule
    from vapo_lit.train import train

    # finer timings than the module's perf/ metrics, by wrapping its stages from outside
    vapo_module.fill_values = timer.timed("values", vapo_module.fill_values)
    vapo_module.fill_advantages = timer.timed("advantages", vapo_module.fill_advantages)

    def count(exp, *_a, **_k):
        timer.extra.update(
            {
                "tokens": int(exp.mask.sum()),
                "min_len": int(exp.lengths.min()),
                "max_len": int(exp.lengths.max()),
            }
        )

    def factory(cfg):
        task = chain_task()
        actor = build_policy(args, task.tokenizer)
        module = VapoModule(cfg, task, actor, task.tokenizer, build_critic(actor, args.seed))
        module.rollout = timer.timed("rollout", module.rollout, after=count)
        module.update_critic = timer.timed("critic update", module.update_critic)
        module.update_actor = timer.timed("actor update", module.update_actor)
        task.verify_batch = timer.timed("verifier", task.verify_batch)
        return module

    class Pace(L.Callback):
        """Step k runs from the parent's k-th "step" to the end of Lightning's batch k."""

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 0:
                link.send(
                    {
                        "ready": True,
                        "params": sum(p.numel() for p in pl_module.actor.parameters()),
                        "critic_params": sum(p.numel() for p in pl_module.critic.parameters()),
                        "components": pl_module.cfg.components,
                    }
                )
                link.wait()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            timer.extra["perf"] = {k: v for k, v in pl_module.last_metrics.items() if k.startswith("perf/")}
            link.done()
            link.wait()

    with tempfile.TemporaryDirectory(prefix="vapo-step-bench-") as out:
        train(ours_config(args, out), extra_callbacks=[Pace()], module_factory=factory)


def trl_missing() -> str | None:
    """None when trl 1.12 (the last release with trl.experimental.ppo) is installed, else why not.
    Read from the package metadata: importing trl here would cost the parent seconds."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("trl")
    except PackageNotFoundError:
        return "trl is not installed; pip install 'vapo-lit[bench]'"
    return (
        None
        if v.startswith("1.12.")
        else f"trl {v} is installed; trl.experimental.ppo is benchmarked at 1.12"
    )


def worker_trl(args, link: Link, timer: Timer) -> None:
    import gc
    import types

    from datasets import Dataset
    from transformers import LlamaForSequenceClassification, TrainerCallback
    from trl.experimental.ppo import PPOConfig, PPOTrainer
    from trl.experimental.ppo import ppo_trainer as trl_ppo

    task = chain_task()
    tok = copy.deepcopy(task.tokenizer)
    tok.padding_side = "left"
    actor = build_policy(args, tok)
    critic = build_critic(actor, args.seed)

    def scorer():
        """A LlamaForSequenceClassification with our critic's weights (TRL's value and reward model)."""
        config = llama_config(args, tok)
        config.num_labels = 1
        m = LlamaForSequenceClassification(config)
        m.model.load_state_dict(critic.backbone.state_dict())
        with torch.no_grad():
            m.score.weight.copy_(critic.head.weight)
        return m.eval()

    steps = args.warmup + args.reps + 4
    prompts = [pr.prompt for s in range(steps) for pr in prompts_of_step(task, args, s)]
    data = Dataset.from_dict({"input_ids": [tok(p)["input_ids"] for p in prompts]})
    out = tempfile.mkdtemp(prefix="vapo-step-bench-trl-")
    config = PPOConfig(
        output_dir=out,
        per_device_train_batch_size=args.responses,
        gradient_accumulation_steps=1,
        num_mini_batches=args.responses // args.mini_batch,
        num_ppo_epochs=1,
        response_length=args.tokens,
        temperature=1.0,
        stop_token=None,
        total_episodes=len(prompts),
        local_rollout_forward_batch_size=args.responses,
        num_sample_generations=0,
        report_to=[],
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        learning_rate=5e-5,
        lr_scheduler_type="constant",
        save_strategy="no",
        disable_tqdm=True,
        seed=args.seed,
        logging_steps=10**9,
        dataloader_num_workers=0,
    )
    if args.micro_batch != args.mini_batch:
        # TRL's micro-batch is per_device_train_batch_size, which also sets its batch: with micro <
        # mini its accumulate() would step the optimizer once per gradient_accumulation_steps micro-batches
        print("note: TRL runs micro-batch = mini-batch (its batch-size semantics)", file=sys.stderr)
    trainer = None

    class Pace(TrainerCallback):
        def on_train_begin(self, *a, **k):
            link.send(
                {
                    "ready": True,
                    "params": sum(p.numel() for p in actor.parameters()),
                    "critic_params": sum(p.numel() for p in trainer.value_model.parameters()),
                }
            )
            link.wait()

        def on_step_end(self, *a, **k):
            link.done()
            link.wait()

    trainer = PPOTrainer(
        args=config,
        processing_class=tok,
        model=actor,
        ref_model=copy.deepcopy(actor),
        reward_model=scorer(),
        value_model=scorer(),
        train_dataset=data,
        eval_dataset=data.select(range(8)),
        callbacks=[Pace()],
    )

    # the split: wrap the trainer's stages (module globals and instance methods) from outside
    def count(out, model, queries, *_a, **_k):
        resp = out[0][:, queries.shape[1] :]
        ended = (resp == tok.pad_token_id) | (resp == tok.eos_token_id)  # where TRL's response ends
        lengths = torch.where(ended.any(1), ended.float().argmax(1), torch.full((len(resp),), resp.shape[1]))
        timer.extra.update(
            {"tokens": int(lengths.sum()), "min_len": int(lengths.min()), "max_len": int(lengths.max())}
        )

    trl_ppo.batch_generation = timer.timed("rollout", trl_ppo.batch_generation, after=count)
    plain_forward, plain_reward = trl_ppo.forward, trl_ppo.get_reward

    def forward(model, *a, **k):
        name = "update (joint)" if torch.is_grad_enabled() else "reference forward"
        return timer.timed(name, plain_forward)(model, *a, **k)

    def get_reward(model, *a, **k):
        name = "reward model" if model is trainer.reward_model else "values"
        return timer.timed(name, plain_reward)(model, *a, **k)

    trl_ppo.forward, trl_ppo.get_reward = forward, get_reward
    trl_ppo.gc = types.SimpleNamespace(collect=timer.timed("gc.collect", gc.collect))
    trainer.accelerator.backward = timer.timed("update (joint)", trainer.accelerator.backward)
    trainer.optimizer.step = timer.timed("update (joint)", trainer.optimizer.step)
    trainer.train()


# ============================================================================ the parent
def worker_command(args, side: str) -> list[str]:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", side]
    for name in (
        "responses",
        "tokens",
        "mini_batch",
        "micro_batch",
        "samples_per_prompt",
        "reps",
        "warmup",
        "hidden",
        "layers",
        "heads",
        "intermediate",
        "seed",
    ):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.profile:
        cmd += ["--profile", args.profile]
    return cmd


class Worker:
    def __init__(self, args, side: str, log_dir: str):
        self.side = side
        self.log = Path(log_dir) / f"{side}.stderr"
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "WANDB_MODE": "disabled",
            "TRL_EXPERIMENTAL_SILENCE": "1",
            "PYTHONPATH": os.pathsep.join(
                [str(Path(__file__).resolve().parents[1])] + [p for p in [os.environ.get("PYTHONPATH")] if p]
            ),
        }
        self.err = open(self.log, "w")  # noqa: SIM115 - the worker writes it until close()
        self.proc = subprocess.Popen(
            worker_command(args, side),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
            env=env,
        )

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            tail = self.log.read_text()[-3000:]
            raise SystemExit(
                f"the {self.side} worker stopped (exit {self.proc.wait()}); its stderr ends:\n{tail}"
            )
        return json.loads(line)

    def step(self) -> dict:
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


def fmt_range(xs, f="{:.2f}") -> str:
    return f"{f.format(statistics.median(xs))} [{f.format(min(xs))}-{f.format(max(xs))}]"


PARTS = (
    "rollout",
    "verifier",
    "reward model",
    "reference forward",
    "values",
    "advantages",
    "critic update",
    "actor update",
    "update (joint)",
    "gc.collect",
)


def report(args, sides, ready, results, load_before) -> None:
    med = {s: statistics.median(r["seconds"] for r in results[s]) for s in sides}
    print(
        f"step benchmark: one RL step per side, {len(results[sides[0]])} timed repetitions after {args.warmup} warm-up, "
        f"interleaved (order rotates each repetition)"
    )
    r0 = ready[sides[0]]
    print(
        f"model: random Llama, {r0['params']:,} parameters (hidden {args.hidden}, {args.layers} layers, {args.heads} heads, "
        f"MLP {args.intermediate}, vocab {args.vocab} = the chain task's tokenizer), critic {r0['critic_params']:,}; "
        f"fp32, CPU, 1 torch thread per process; EOS and pad logits fixed at -1e9"
    )
    print(
        f"batch: {args.responses} responses x {args.tokens} tokens, {args.responses // args.mini_batch} mini-batches of "
        f"{args.mini_batch}, micro-batch {args.micro_batch}, 1 epoch; {args.responses // args.samples_per_prompt} prompts x "
        f"{args.samples_per_prompt} samples of the chain task's 5-token prompts on every side"
    )
    if "ours" in ready:
        print(
            f"ours: the default preset, components {','.join(ready['ours']['components'])} (value pretraining off: a phase "
            f"before PPO)"
        )
    print(
        f"load average (1 min) before: {load_before:.2f}, after: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    print()
    print(
        "| side | s / step, median [min-max] | generated tokens / s, median [min-max] | tokens / step | response length "
        "| time vs ours |"
    )
    print("|---|---|---|---|---|---|")
    for s in sides:
        rs = results[s]
        tps = [r["tokens"] / r["seconds"] for r in rs]
        lens = f"{min(r['min_len'] for r in rs)}-{max(r['max_len'] for r in rs)}"
        vs = f"{med[s] / med['ours']:.2f}x" if "ours" in med else "-"
        print(
            f"| {s} | {fmt_range([r['seconds'] for r in rs])} | {fmt_range([t for t in tps], '{:.0f}')} "
            f"| {rs[0]['tokens']} | {lens} | {vs} |"
        )
    print()
    print("split, median seconds per step (ratio: side / ours)")
    print("| part | " + " | ".join(sides) + " |")
    print("|---|" + "---|" * len(sides))
    split_med = {
        s: {p: statistics.median(r["split"].get(p, 0.0) for r in results[s]) for p in PARTS} for s in sides
    }
    for s in sides:
        split_med[s]["rest"] = statistics.median(r["seconds"] - sum(r["split"].values()) for r in results[s])
    for part in PARTS + ("rest",):
        has = {s: part == "rest" or any(part in r["split"] for r in results[s]) for s in sides}
        if not any(has.values()):
            continue
        cells = []
        for s in sides:
            x = split_med[s][part]
            ratio = ""
            if s != "ours" and has[s] and has.get("ours") and split_med["ours"][part] > 0:
                ratio = f" ({x / split_med['ours'][part]:.2f}x)"
            cells.append(f"{x:.3f}{ratio}" if has[s] else "-")
        print(f"| {part} | " + " | ".join(cells) + " |")
    if "ours" in sides:
        perf = {
            k: statistics.median(r["perf"][k] for r in results["ours"])
            for k in results["ours"][0]["perf"]
            if k.endswith("_seconds") and k != "perf/eval_seconds" and not k.startswith("perf/cumulative")
        }
        print(
            "(ours, the module's own perf/ metrics, medians: "
            + ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in perf.items())
            + ")"
        )
    if "ours" in sides and len(sides) > 1:
        # The passes after the rollout (values, critic and actor forward/backward) run the same
        # matrix products on the same tokens on every side; if they are compute-bound, no sampler
        # can lift the ratio above this.
        rest = med["ours"] - split_med["ours"]["rollout"]
        print(
            f"ceiling if our rollout took no time (ours minus its rollout = {rest:.3f} s): "
            + ", ".join(f"{s} {med[s] / rest:.2f}x" for s in sides if s != "ours")
        )
    if "ours" in sides and "trl" in sides:
        ours_update = split_med["ours"]["critic update"] + split_med["ours"]["actor update"]
        print(
            f"(update, critic + actor: ours {ours_update:.3f} s, TRL joint {split_med['trl']['update (joint)']:.3f} s)"
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--responses", type=int, default=64, help="responses per step (every side)")
    ap.add_argument(
        "--tokens", type=int, default=96, help="tokens per response (exactly: EOS and pad are suppressed)"
    )
    ap.add_argument("--mini-batch", type=int, default=32, help="responses per optimizer step")
    ap.add_argument("--micro-batch", type=int, default=32, help="responses per forward/backward")
    ap.add_argument("--samples-per-prompt", type=int, default=8, help="group sampling: samples per prompt")
    ap.add_argument("--reps", type=int, default=7, help="timed steps per side (medians over these)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per side first")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument(
        "--intermediate", type=int, default=544, help="MLP width (the default gives 0.86M parameters)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--sides", default=",".join(SIDES), help=f"comma-separated, from {','.join(SIDES)} (ours first)"
    )
    ap.add_argument("--no-trl", action="store_true", help="skip TRL (the last line then says why)")
    ap.add_argument(
        "--long",
        action="store_true",
        help="also run 32 responses x 1,024 tokens, mini-batch 16, micro-batch 8 "
        "(after the shape given; its speedups on the line before the last)",
    )
    ap.add_argument(
        "--quick", action="store_true", help="8 responses x 8 tokens, mini-batch 4, 1 repetition, no warm-up"
    )
    ap.add_argument(
        "--profile", metavar="DIR", help="cProfile each side's timed steps into DIR/<side>.prof (slows them)"
    )
    ap.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.responses, args.tokens, args.mini_batch, args.micro_batch = 8, 8, 4, 4
        args.samples_per_prompt, args.reps, args.warmup = 4, 1, 0
    for name in (
        "responses",
        "tokens",
        "mini_batch",
        "micro_batch",
        "samples_per_prompt",
        "reps",
        "hidden",
        "layers",
        "heads",
        "intermediate",
    ):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")
    if args.warmup < 0:
        ap.error(f"--warmup must be >= 0; got {args.warmup}")
    if args.responses % args.mini_batch or args.mini_batch % args.micro_batch:
        ap.error(
            f"--responses {args.responses} must be a multiple of --mini-batch {args.mini_batch}, and that of "
            f"--micro-batch {args.micro_batch}"
        )
    if args.responses % args.samples_per_prompt:
        ap.error(
            f"--responses {args.responses} must be a multiple of --samples-per-prompt {args.samples_per_prompt}"
        )
    if args.hidden % args.heads:
        ap.error(f"--hidden {args.hidden} must be a multiple of --heads {args.heads}")
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    bad = [s for s in sides if s not in SIDES]
    if bad or not sides or sides[0] != "ours" or len(set(sides)) != len(sides):
        ap.error(f"--sides {args.sides!r} is not valid: distinct names from {', '.join(SIDES)}, ours first")

    torch.set_num_threads(1)
    if args.worker:
        timer = Timer(str(Path(args.profile) / f"{args.worker}.prof") if args.profile else None)
        link = Link(timer)
        {"ours": worker_ours, "plain": worker_plain, "trl": worker_trl}[args.worker](args, link, timer)
        return 0

    trl_skip = None
    if "trl" in sides:
        trl_skip = "--no-trl" if args.no_trl else trl_missing()
        if trl_skip:
            sides.remove("trl")
    elif "trl" not in sides:
        trl_skip = "not in --sides"
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    shapes = [args]
    if args.long:  # the long-response shape after the one given, each with its own workers
        shapes.append(argparse.Namespace(**{**vars(args), **LONG_SHAPE}))
    lines = []
    for shape in shapes:
        med = run_shape(shape, sides)
        if med is None:
            return 1
        lines.append((shape, summary(med, trl_skip)))
        print()
    for shape, line in lines[1:]:
        print(
            f"{shape.responses} x {shape.tokens} tokens (mini-batch {shape.mini_batch}, micro-batch "
            f"{shape.micro_batch}): {line}"
        )
    print(lines[0][1])
    return 0


LONG_SHAPE = {"responses": 32, "tokens": 1024, "mini_batch": 16, "micro_batch": 8}
"""--long: VAPO's regime, 32 responses of exactly 1,024 tokens, 2 mini-batches of 16, micro-batch 8."""


def run_shape(args, sides) -> dict | None:
    """Every side's workers at `args`' shape, the interleaved repetitions and the report; the
    median step seconds per side (None, after saying why, if token counts differ)."""
    args.vocab = len(chain_task().tokenizer)
    load_before = os.getloadavg()[0]
    log_dir = tempfile.mkdtemp(prefix="vapo-step-bench-logs-")
    workers = {s: Worker(args, s, log_dir) for s in sides}
    try:
        ready = {s: w.read() for s, w in workers.items()}
        results = {s: [] for s in sides}
        for rep in range(args.warmup + args.reps):
            order = sides[rep % len(sides) :] + sides[: rep % len(sides)]
            times = {}
            for s in order:
                r = workers[s].step()
                times[s] = r["seconds"]
                if rep >= args.warmup:
                    results[s].append(r)
            print(
                f"# {args.responses} x {args.tokens}, repetition {rep + 1}/{args.warmup + args.reps}"
                f"{' (warm-up)' if rep < args.warmup else ''}: "
                + ", ".join(f"{s} {times[s]:.2f} s" for s in order),
                file=sys.stderr,
                flush=True,
            )
    finally:
        for w in workers.values():
            w.close()
    report(args, sides, ready, results, load_before)
    tokens = {s: {r["tokens"] for r in results[s]} for s in sides}
    expected = args.responses * args.tokens
    if any(t != {expected} for t in tokens.values()):
        print(
            f"error: the sides generated different token counts per step {tokens}; expected {expected} each"
        )
        return None
    return {s: statistics.median(r["seconds"] for r in results[s]) for s in sides}


def summary(med: dict, trl_skip) -> str:
    """``speedup vs plain: X.XXx; vs TRL: Y.YYx`` (median step of the other side / ours)."""
    vs_plain = f"{med['plain'] / med['ours']:.2f}x" if "plain" in med else "skipped (not in --sides)"
    vs_trl = f"{med['trl'] / med['ours']:.2f}x" if "trl" in med else f"skipped ({trl_skip})"
    return f"speedup vs plain: {vs_plain}; vs TRL: {vs_trl}"


if __name__ == "__main__":
    sys.exit(main())
