"""`VapoModule`: one PPO iteration per `training_step`, actor and critic under manual optimization.

    1. rollout      sample responses (KV cache), behaviour log-probs recorded at sampling time
    2. score        verifier 0/1 on the last response token; verifier failures counted apart
    3. values       critic V(s_t) for every response token; bootstrap value for truncated rows
    4. advantages   decoupled GAE: actor advantages (lambda_policy), critic targets (lambda_critic)
    5. critic       value-loss updates over mini-batches (the only update during value pretraining)
    6. actor        clipped policy loss (+ mu * positive NLL) over mini-batches
    7. log          metrics -> CSV + W&B, eval/avg@k every `eval_every` iterations

The seven VAPO components are not branches hidden in here: they are callbacks that set
`self.switches` in `setup` (see `vapo_lit/components/`); with none, this is vanilla PPO.
"""
from __future__ import annotations

import math
import random
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from vapo_lit import algos
from vapo_lit.config import RunConfig, Switches, to_dict
from vapo_lit.rollout import Rollout, generate, next_token_logits

POSITION_EDGES = (1, 8, 32, 128)
"""Response-position buckets of value/bias: first token, 1-7, 8-31, 32-127, 128+."""
LENGTH_EDGES = (20, 50, 100, 200)
"""Response-length buckets of value/bias: <20 (lambda 0 at alpha 0.05), 20-49, 50-99, 100-199, 200+."""


class NonFiniteLossError(RuntimeError):
    """A loss became NaN or inf: the run stops and says where."""


def step_seed(seed: int, iteration: int, salt: int = 0) -> int:
    """A per-iteration seed, so a resumed run samples exactly what the uninterrupted one did."""
    return (seed * 1_000_003 + iteration * 7_919 + salt * 104_729) % (2**63 - 1)


class PromptStream(IterableDataset):
    """Endless prompt batches; batch i is a pure function of (seed, start + i)."""

    def __init__(self, task, prompts_per_step: int, seed: int, start: int = 0):
        self.task, self.n, self.seed, self.start = task, prompts_per_step, seed, start

    def __iter__(self):
        i = self.start
        while True:
            yield self.task.train_problems(self.n, seed=step_seed(self.seed, i, salt=1))
            i += 1


class VapoModule(L.LightningModule):
    def __init__(self, cfg: RunConfig, task, actor, tokenizer, critic):
        super().__init__()
        self.automatic_optimization = False
        self.cfg, self.task, self.tokenizer = cfg, task, tokenizer
        self.actor, self.critic = actor, critic
        self.switches = Switches()  # vanilla PPO until component callbacks switch things on
        self.phase = "ppo"  # "value_pretrain" while the ValuePretraining callback says so
        self.iteration = 0  # rollouts done (position in the prompt stream and RNG)
        self.ppo_updates = 0  # PPO iterations with an actor update (Lightning's global_step counts both optimizers)
        self.actor_steps = 0
        self.critic_steps = 0
        self.best_eval = -math.inf
        self.last_metrics: dict[str, float] = {}
        self.last_good_checkpoint: str | None = None
        self.max_new_tokens = cfg.ppo.max_new_tokens or task.max_new_tokens
        self.eval_set = eval_subset(task, cfg.eval_problems)
        self._pending_eval: dict[str, float] = {}
        self._resumed = False

    # ------------------------------------------------------------------ identity / cache hooks
    def critic_identity(self) -> dict:
        """Everything that determines a pretrained critic except the pretraining values."""
        c, p = self.cfg, self.cfg.ppo
        return {
            "task": c.task, "task_options": c.task_options, "model": c.model, "critic_init": c.critic_init,
            "seed": c.seed, "model_seed": c.model_seed, "critic_lr": p.critic_lr, "weight_decay": p.weight_decay,
            "warmup_steps": p.warmup_steps, "gamma": p.gamma, "responses_per_step": p.responses_per_step,
            "mini_batch_size": p.mini_batch_size, "micro_batch_size": p.micro_batch_size,
            "critic_epochs": p.critic_epochs, "value_clip": p.value_clip, "grad_clip": p.grad_clip,
            "temperature": p.temperature, "top_p": p.top_p, "max_new_tokens": self.max_new_tokens,
            "prompts_per_step": self.prompts_per_step, "task_version": getattr(self.task, "version", "?"),
        }

    def load_critic_weights(self, directory) -> None:
        from vapo_lit.models.value import ValueModel

        loaded = ValueModel.from_pretrained(directory)
        with torch.no_grad():
            self.critic.load_state_dict(loaded.state_dict())

    def on_value_pretraining_end(self, steps: int, ev: float) -> None:
        self.reset_critic_optimizer()
        self._pending_eval["value_pretrain/steps"] = steps
        self._pending_eval["value_pretrain/final_ev"] = ev

    def reset_critic_optimizer(self) -> None:
        """PPO starts with a fresh critic optimiser and schedule after value pretraining, whether
        the pretrained critic was just trained or loaded from the cache (so both runs match)."""
        opt, sch = self._opt(1)
        opt.optimizer.state.clear() if hasattr(opt, "optimizer") else opt.state.clear()
        sch.last_epoch = 0
        for group, base, fn in zip(sch.optimizer.param_groups, sch.base_lrs, sch.lr_lambdas):
            group["lr"] = base * fn(0)

    # ------------------------------------------------------------------ Lightning plumbing
    @property
    def samples_per_prompt(self) -> int:
        return self.switches.samples_per_prompt if self.switches.group_sampling else 1

    @property
    def prompts_per_step(self) -> int:
        return self.cfg.ppo.responses_per_step // self.samples_per_prompt

    @property
    def critic_free(self) -> bool:
        return self.critic is None

    def configure_optimizers(self):
        p = self.cfg.ppo
        warm = max(1, p.warmup_steps)
        schedule = lambda step: min(1.0, (step + 1) / warm)  # noqa: E731 - warmup, then constant
        opts = [torch.optim.AdamW(self.actor.parameters(), lr=p.actor_lr, weight_decay=p.weight_decay)]
        if not self.critic_free:
            opts.append(torch.optim.AdamW(self.critic.parameters(), lr=p.critic_lr, weight_decay=p.weight_decay))
        return opts, [torch.optim.lr_scheduler.LambdaLR(o, schedule) for o in opts]

    def _opt(self, i: int):
        """(optimizer, scheduler) i: 0 = actor, 1 = critic (Lightning unwraps single lists)."""
        opts, schs = self.optimizers(), self.lr_schedulers()
        opts = opts if isinstance(opts, list) else [opts]
        schs = schs if isinstance(schs, list) else [schs]
        return opts[i], schs[i]

    def train_dataloader(self):
        stream = PromptStream(self.task, self.prompts_per_step, self.cfg.seed, start=self.iteration)
        return DataLoader(stream, batch_size=None, collate_fn=lambda x: x)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch  # a list of Problems (text): nothing to move

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["vapo"] = {
            "iteration": self.iteration, "ppo_updates": self.ppo_updates, "actor_steps": self.actor_steps,
            "critic_steps": self.critic_steps, "best_eval": self.best_eval, "phase": self.phase,
            "switches": to_dict(self.switches), "config": to_dict(self.cfg),
            "rng": {"python": random.getstate(), "torch": torch.get_rng_state()},
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        s = checkpoint["vapo"]
        self.iteration, self.ppo_updates = s["iteration"], s["ppo_updates"]
        self.actor_steps, self.critic_steps = s["actor_steps"], s["critic_steps"]
        self.best_eval, self.phase = s["best_eval"], s["phase"]
        self._resumed = True
        random.setstate(s["rng"]["python"])
        torch.set_rng_state(s["rng"]["torch"])

    def on_train_start(self) -> None:
        if not self._resumed:  # the initial policy's eval: its own row, step 0
            # seeded as iteration 0 even when a cached pretrained critic moved the iteration on, so
            # every run of one seed reports the same base eval
            metrics = {**self.evaluate(at=0), "train/iteration": 0, "train/ppo_update": 0}
            self._log(metrics, step=0)

    # ------------------------------------------------------------------ the algorithm
    def training_step(self, problems, batch_idx):
        pretraining = self.phase == "value_pretrain"
        t_start = time.perf_counter()

        # 1. rollout: prompts_per_step prompts x samples_per_prompt samples
        prompts = [pr for pr in problems for _ in range(self.samples_per_prompt)]
        ro = self.rollout([pr.prompt for pr in prompts], seed=step_seed(self.cfg.seed, self.iteration, 2))
        t_rollout = time.perf_counter()

        # 2. score
        verdicts = self.task.verify_batch(prompts, ro.texts)
        score = torch.tensor([v.reward for v in verdicts], dtype=torch.float32)  # (N,)
        mask = ro.response_mask  # (N, R)
        N, R = mask.shape
        P = ro.prompt_ids.shape[1]
        last = (ro.lengths - 1).clamp(min=0)
        rewards = torch.zeros(N, R)
        rewards[torch.arange(N), last] = score * (ro.lengths > 0)

        # 3-4. values and advantages
        input_ids, attn = ro.input_ids, ro.attention_mask
        lengths = mask.sum(1)
        if self.critic_free:  # the GRPO/DAPO baseline row: group-normalised outcome, no critic
            advantages = algos.group_normalized_advantage(score, mask, self.samples_per_prompt)
            values = returns = None
            lam_policy, n_clamped = None, 0
        else:
            values, returns, advantages, lam_policy, n_clamped = self.advantages(
                input_ids, attn, rewards, mask, ro.truncated, last, P, pretraining)

        batch = dict(input_ids=input_ids, attn=attn, response_ids=ro.response_ids, mask=mask,
                     old_logprobs=ro.logprobs, old_values=values, advantages=advantages,
                     returns=returns, positive=score > 0)

        # 5. critic update
        critic_stats = {} if self.critic_free else self.update_critic(batch, P)
        # 6. actor update (never during value pretraining: the initial policy stays fixed)
        actor_stats = {} if pretraining else self.update_actor(batch, P)
        t_update = time.perf_counter()

        # 7. metrics
        self.iteration += 1
        if not pretraining:
            self.ppo_updates += 1
        metrics = self.rollout_metrics(ro, score, verdicts, lengths, lam_policy, n_clamped)
        if not self.critic_free:
            metrics.update(self.critic_metrics(values, returns, mask, score, lengths))
        metrics.update(critic_stats)
        metrics.update(actor_stats)
        metrics.update({
            "perf/rollout_seconds": t_rollout - t_start, "perf/update_seconds": t_update - t_rollout,
            "perf/step_seconds": t_update - t_start,
            "perf/tokens_per_second": float(lengths.sum()) / max(t_update - t_start, 1e-9),
            "train/iteration": self.iteration, "train/ppo_update": self.ppo_updates,
            "train/value_pretraining": float(pretraining),
            "train/actor_lr": self._opt(0)[0].param_groups[0]["lr"],
        })
        if not self.critic_free:
            metrics["train/critic_lr"] = self._opt(1)[0].param_groups[0]["lr"]
        done = self.ppo_updates >= self.cfg.steps
        if not pretraining and (done or (self.cfg.eval_every and self.ppo_updates % self.cfg.eval_every == 0)):
            self._pending_eval.update(self.evaluate())
        metrics.update(self._pending_eval)
        self._pending_eval = {}
        metrics["perf/total_seconds"] = time.perf_counter() - t_start
        self.last_metrics = metrics
        self._log(metrics, step=self.iteration)
        if done:
            self.trainer.should_stop = True

    def _log(self, metrics: dict, step: int) -> None:
        for logger in self.loggers:
            logger.log_metrics(metrics, step=step)
            logger.save()  # a killed run keeps every finished iteration

    # ------------------------------------------------------------------ pieces of the step
    @torch.no_grad()
    def advantages(self, input_ids, attn, rewards, mask, truncated, last, P, pretraining):
        """Critic values V(s_t) (read at column P + t - 1), bootstrap values of truncated rows,
        and decoupled GAE: actor advantages with lambda_policy, critic targets with lambda_critic."""
        sw, p = self.switches, self.cfg.ppo
        N = mask.shape[0]
        v_full = self.critic(input_ids, attn)  # (N, P + R)
        values = v_full[:, P - 1:-1] * mask
        bootstrap = torch.where(truncated, v_full[torch.arange(N), P + last], torch.zeros(N))
        lengths = mask.sum(1).clamp(min=1)
        if sw.length_adaptive_gae:
            lam_policy = algos.length_adaptive_lambda(lengths, sw.alpha, p.gamma)
            n_clamped = algos.lambda_clamped(lengths, sw.alpha, p.gamma)
        else:
            lam_policy, n_clamped = torch.full((N,), p.lam), 0
        if pretraining:
            lam_critic = 1.0  # Monte-Carlo returns
        elif sw.decoupled_gae:
            lam_critic = sw.lambda_critic
        else:
            lam_critic = lam_policy  # one lambda for both
        advantages, returns = algos.decoupled_gae(
            rewards, values, mask, lam_policy, lam_critic, gamma=p.gamma, bootstrap_values=bootstrap)
        if p.whiten_advantages:
            advantages = algos.masked_whiten(advantages, mask)
        return values, returns, advantages, lam_policy, n_clamped

    @torch.no_grad()
    def rollout(self, prompts: list[str], seed: int, temperature=None, top_p=None) -> Rollout:
        g = torch.Generator().manual_seed(seed)
        return generate(self.actor, self.tokenizer, prompts, max_new_tokens=self.max_new_tokens,
                        temperature=temperature or self.cfg.ppo.temperature,
                        top_p=top_p or self.cfg.ppo.top_p, generator=g)

    def _minibatches(self, N: int, salt: int):
        """Shuffled mini-batches, each split into micro-batches (seeded by the iteration)."""
        g = torch.Generator().manual_seed(step_seed(self.cfg.seed, self.iteration, salt))
        perm = torch.randperm(N, generator=g)
        mb, micro = self.cfg.ppo.mini_batch_size, self.cfg.ppo.micro_batch_size
        for s in range(0, N, mb):
            idx = perm[s:s + mb]
            yield idx, [idx[k:k + micro] for k in range(0, len(idx), micro)]

    def _forward_actor(self, batch, idx, P):
        logits = next_token_logits(self.actor, batch["input_ids"][idx], batch["attn"][idx],
                                   temperature=self.cfg.ppo.temperature)[:, P - 1:]  # predicts response token t
        return algos.token_logprobs(logits, batch["response_ids"][idx]), logits

    def update_critic(self, batch, P) -> dict:
        opt, sch = self._opt(1)
        mask = batch["mask"]
        losses, norms = [], []
        for epoch in range(self.cfg.ppo.critic_epochs):
            for idx, micros in self._minibatches(len(mask), salt=10 + epoch):
                den = mask[idx].sum()
                total = 0.0
                for mi in micros:
                    v = self.critic(batch["input_ids"][mi], batch["attn"][mi])[:, P - 1:-1]
                    loss = algos.value_loss(v, batch["returns"][mi], mask[mi], old_values=batch["old_values"][mi],
                                            clip_range=self.cfg.ppo.value_clip, denominator=den)
                    self._check_finite("value/loss", loss)
                    self.manual_backward(loss)
                    total += loss.item()
                norms.append(self._clip(self.critic))
                opt.step()
                opt.zero_grad(set_to_none=True)
                sch.step()
                self.critic_steps += 1
                losses.append(total)
        return {"value/loss": _mean(losses), "value/grad_norm": _mean(norms)}

    def update_actor(self, batch, P) -> dict:
        sw, p = self.switches, self.cfg.ppo
        opt, sch = self._opt(0)
        mask = batch["mask"]
        eps_high = sw.eps_high if sw.clip_higher else p.eps
        aggregation = "token" if sw.token_level_loss else "sample"
        acc = {k: [] for k in ("loss/policy", "loss/nll", "loss/total", "policy/entropy", "policy/clipfrac_low",
                               "policy/clipfrac_high", "policy/approx_kl", "policy/ratio_mean", "policy/grad_norm")}
        ratio_max = 0.0
        for epoch in range(p.ppo_epochs):
            for idx, micros in self._minibatches(len(mask), salt=20 + epoch):
                m = mask[idx]
                den = m.sum() if aggregation == "token" else (m.sum(1) > 0).sum()
                pos_den = (m * batch["positive"][idx, None]).sum()
                sums = {k: 0.0 for k in ("loss/policy", "loss/nll", "loss/total")}
                for mi in micros:
                    logp, logits = self._forward_actor(batch, mi, P)
                    pg_loss, st = algos.policy_loss(
                        logp, batch["old_logprobs"][mi], batch["advantages"][mi], mask[mi],
                        eps_low=p.eps, eps_high=eps_high, aggregation=aggregation, denominator=den)
                    loss = pg_loss
                    nll = torch.zeros(())
                    if sw.positive_lm_loss:
                        nll, _, _ = algos.positive_nll(logp, mask[mi], batch["positive"][mi], denominator=pos_den)
                        loss = loss + sw.mu * nll
                    self._check_finite("loss/policy", pg_loss)
                    self._check_finite("loss/nll", nll)
                    self.manual_backward(loss)
                    w = mask[mi].sum() / m.sum()  # token share of this micro-batch, for the diagnostics
                    with torch.no_grad():
                        ent = algos.masked_mean(algos.entropy_from_logits(logits), mask[mi])
                    for k, val in (("loss/policy", pg_loss), ("loss/nll", nll), ("loss/total", loss)):
                        sums[k] += float(val.detach())
                    for k, val in (("policy/entropy", ent), ("policy/clipfrac_low", st.clipfrac_low),
                                   ("policy/clipfrac_high", st.clipfrac_high), ("policy/approx_kl", st.approx_kl),
                                   ("policy/ratio_mean", st.ratio_mean)):
                        acc[k].append((float(val) * float(w), float(w)))
                    ratio_max = max(ratio_max, float(st.ratio_max))
                acc["policy/grad_norm"].append((self._clip(self.actor), 1.0))
                opt.step()
                opt.zero_grad(set_to_none=True)
                sch.step()
                self.actor_steps += 1
                for k, v in sums.items():
                    acc[k].append((v, 1.0))
        out = {k: sum(a for a, _ in v) / max(sum(w for _, w in v), 1e-12) for k, v in acc.items() if v}
        out["policy/ratio_max"] = ratio_max
        return out

    def _clip(self, model) -> float:
        params = [q for q in model.parameters() if q.grad is not None]
        clip = self.cfg.ppo.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        self._check_finite("grad_norm", norm)
        return float(norm)

    def _check_finite(self, name: str, t: torch.Tensor) -> None:
        if not bool(torch.isfinite(t).all()):
            raise NonFiniteLossError(
                f"{name} is {t.detach().flatten()[:4].tolist()} (not finite) at iteration {self.iteration} "
                f"(PPO update {self.ppo_updates}, phase {self.phase}); the run stops here. "
                f"Last good checkpoint: {self.last_good_checkpoint or 'none saved yet'}"
            )

    # ------------------------------------------------------------------ metrics
    def rollout_metrics(self, ro, score, verdicts, lengths, lam_policy, n_clamped) -> dict:
        lf = lengths.float()
        pos = score > 0
        m = {
            "objective/score": float(score.mean()),
            "objective/accuracy": float(pos.float().mean()),
            "objective/strict_accuracy": _mean([float(bool(v.strict)) for v in verdicts if v.strict is not None]),
            "rollout/response_length": float(lf.mean()),
            "rollout/response_length_min": float(lf.min()),
            "rollout/response_length_max": float(lf.max()),
            "rollout/response_length_p90": float(torch.quantile(lf, 0.9)),
            "rollout/truncated_frac": float(ro.truncated.float().mean()),
            "rollout/positive_responses": float(pos.sum()),
            "rollout/positive_tokens": float(lengths[pos].sum()),
            "rollout/verifier_errors": float(sum(v.error is not None for v in verdicts)),
            "rollout/prompts": float(len(ro.texts) // self.samples_per_prompt),
            "rollout/samples_per_prompt": float(self.samples_per_prompt),
        }
        if lam_policy is not None:
            m.update({"gae/lambda_policy_mean": float(lam_policy.mean()), "gae/lambda_policy_min": float(lam_policy.min()),
                      "gae/lambda_policy_max": float(lam_policy.max()), "gae/lambda_policy_clamped": float(n_clamped)})
        if self.samples_per_prompt > 1:  # how many groups hold both a right and a wrong answer
            g = score.view(-1, self.samples_per_prompt)
            m["rollout/mixed_groups_frac"] = float(((g.max(1).values > 0) & (g.min(1).values == 0)).float().mean())
        return m

    def critic_metrics(self, values, returns, mask, score, lengths) -> dict:
        pos = (score > 0)[:, None].float() * mask
        neg = (score == 0)[:, None].float() * mask
        out = {
            "value/explained_variance": float(algos.explained_variance(values, returns, mask)),
            "value/explained_variance_pos": float(algos.explained_variance(values, returns, pos)),
            "value/explained_variance_neg": float(algos.explained_variance(values, returns, neg)),
            "value/mean": float(algos.masked_mean(values, mask)),
            "value/return_mean": float(algos.masked_mean(returns, mask)),
            "value/bias": float(algos.masked_mean(values - returns, mask)),
        }
        first = torch.zeros_like(mask)
        first[:, 0] = mask[:, 0]
        out["value/bias_first_token"] = float(algos.masked_mean(values - returns, first))
        for name, edges, by in (("pos", POSITION_EDGES, "position"), ("len", LENGTH_EDGES, "length")):
            bias, counts = algos.value_bias(values, returns, mask, edges, by=by)
            labels = _bucket_labels(edges)
            for lab, b, c in zip(labels, bias.tolist(), counts.tolist()):
                if c:
                    out[f"value/bias_{name}_{lab}"] = b
        return out

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, at: int | None = None) -> dict:
        """eval/... of the current actor; sampling seeded by iteration `at` (default: the current one)."""
        from vapo_lit.evaluation import evaluate

        t0 = time.perf_counter()
        at = self.iteration if at is None else at
        metrics = evaluate(self.actor, self.task, self.eval_set, k=self.cfg.eval_k,
                           temperature=self.cfg.eval_temperature, top_p=self.cfg.eval_top_p,
                           max_new_tokens=self.max_new_tokens, seed=step_seed(self.cfg.seed, at, 3))
        metrics = {k: float(v) for k, v in metrics.items()}
        metrics["perf/eval_seconds"] = time.perf_counter() - t0
        key = f"eval/avg@{self.cfg.eval_k}"
        if key in metrics and metrics[key] > self.best_eval:
            self.best_eval = metrics[key]
            metrics["eval/is_best"] = 1.0
        return metrics


def eval_subset(task, n: int | None) -> list:
    """The first n eval problems of each bucket in turn (round robin), so a subset still covers
    every length bucket evenly; all of them when n is None."""
    problems = task.eval_problems()
    if not n or n >= len(problems):
        return problems
    by_bucket: dict[str, list] = {}
    for pr in problems:
        by_bucket.setdefault(task.bucket(pr), []).append(pr)
    queues = [by_bucket[b] for b in task.bucket_names() if b in by_bucket]
    out, i = [], 0
    while len(out) < n:
        q = queues[i % len(queues)]
        j = i // len(queues)
        if j < len(q):
            out.append(q[j])
        i += 1
    return out


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def _bucket_labels(edges) -> list[str]:
    edges = list(edges)
    labels = [f"lt{edges[0]}"] if edges[0] > 1 else ["first"]
    labels += [f"{a}-{b - 1}" for a, b in zip(edges[:-1], edges[1:])]
    labels.append(f"ge{edges[-1]}")
    return labels
