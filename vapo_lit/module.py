"""`VapoModule`: one PPO iteration per `training_step`, actor and critic under manual optimization.

    1. rollout      the engine samples prompts x samples_per_prompt responses; behaviour log-probs
                    (in PPO a component may then resample: `on_rollout`)
    2. score        verifier 0/1 on the last response token; verifier failures counted apart
    3. values       critic V(s_t) for every response token (and after the last, for truncated rows)
    4. advantages   decoupled GAE: actor advantages (lambda_policy), critic targets (lambda_critic)
    5. critic       value-loss updates over mini-batches (the only update during value pretraining;
                    in PPO also over the ppo.critic_replay - 1 batches before this one)
    6. actor        clipped policy loss (+ mu * positive NLL, + components' terms) over mini-batches;
                    weights to the engine
    7. statistics   typed, stage by stage (`IterationStats`, vapo_lit/update_stats.py); counters
    8. evaluate     eval/avg@k every `eval_every` PPO updates and after the last
    9. log          the statistics as metrics -> CSV + W&B (the only place a metrics dict is built)
   10. stop         after `steps` PPO updates

The iteration's data is one `Experience` (vapo_lit/experience.py) filled by pure stages. The
components are not branches hidden in here: each is a callback that joins `self.components` in
`setup` and says what it changes through hooks (vapo_lit/components/base.py) that the steps call:
the samples per prompt, the advantage and loss settings (vanilla PPO's, folded through every
component's hook), what happens before PPO, and the iteration's extra work. This module never asks
which component is on; with none, it is vanilla PPO. The critic-only phase before PPO is the
module's (`self.pretrain`, vapo_lit/pretrain.py), run when a component's `before_ppo` asks for it
and ended by that component's rule.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import math
import random
import time
from dataclasses import dataclass

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from vapo_lit import algos, passes, pretrain
from vapo_lit.config import RunConfig, Switches, to_dict
from vapo_lit.devices import (
    autocast_off,
    clear_autocast_cache_after_steps,
    longest_prompt,
    recompute_logprobs,
    resolve_memory_defaults,
)
from vapo_lit.distributed import (
    ActorScorer,
    DataParallel,
    agree_any,
    all_reduce,
    gather_experience,
    is_fsdp_strategy,
    rank_and_world,
    shard_model,
)
from vapo_lit.engines import SamplingParams, make_engine
from vapo_lit.evaluation import eval_subset, sample_responses, summarize
from vapo_lit.experience import (
    AdvantageSettings,
    Experience,
    LossSettings,
    fill_advantages,
    fill_oracle_values,
    fill_values,
    loss_share_by_length,
    rollout_stats,
    score,
    score_stats,
    value_stats,
)
from vapo_lit.replay import CriticReplay
from vapo_lit.update_stats import ActorStats, CriticStats, IterationStats, SamplerStats, mean
from vapo_lit.rng import Stream, sample_seed, step_seed
from vapo_lit.rollout import concat_rollouts, pad_id_of


class Role(enum.Enum):
    """One of the two trained models: its optimizer's index and the loss checked before its step."""

    ACTOR = (0, "loss/policy")
    CRITIC = (1, "value/loss")

    def __init__(self, optimizer_index: int, loss_metric: str):
        self.optimizer_index, self.loss_metric = optimizer_index, loss_metric


class NonFiniteLossError(RuntimeError):
    """A loss became NaN or inf: the run stops and says where."""


class Prompts:
    """One iteration's problems. A plain container on purpose: Lightning's precision plugins walk
    a batch's lists and dataclasses to cast tensors, and the frozen `Problem`s must stay untouched."""

    def __init__(self, problems: list):
        self.problems = problems

    def __iter__(self):
        return iter(self.problems)

    def __len__(self) -> int:
        return len(self.problems)


class PromptStream(IterableDataset):
    """Endless prompt batches; batch i is a pure function of (seed, start + i)."""

    def __init__(self, task, prompts_per_step: int, seed: int, start: int = 0):
        self.task, self.n, self.seed, self.start = task, prompts_per_step, seed, start

    def __iter__(self):
        i = self.start
        while True:
            yield Prompts(self.task.train_problems(self.n, seed=step_seed(self.seed, i, Stream.PROMPTS)))
            i += 1


@dataclass(frozen=True)
class EvalResult:
    """The last evaluation: when it ran, its metrics and whether it is the best so far."""

    iteration: int
    ppo_update: int
    score: float
    is_best: bool
    metrics: dict
    samples: tuple = ()
    """The evaluation's verified samples (`evaluation.Sample`, k per problem in problem order)."""


class VapoModule(L.LightningModule):
    def __init__(self, cfg: RunConfig, task, actor, tokenizer, critic):
        super().__init__()
        self.automatic_optimization = False
        self.cfg, self.task, self.tokenizer = cfg, task, tokenizer
        self.policy = ActorScorer(
            actor
        )  # the actor, behind the one call the update (and DDP/FSDP) goes through
        self.critic = critic
        self.data_parallel = DataParallel()  # the DDP/FSDP wrappers, once a strategy sets them
        self.switches = (
            Switches()
        )  # what the components record of themselves (run card, checkpoint); never read here
        self.pretrain = pretrain.PretrainPhase()
        self.critic_replay = CriticReplay(
            cfg.ppo.critic_replay
        )  # the batches step 5 trains on besides this one
        self.components: list = []  # the components on (components/base.py), joined in their setup: their hooks
        self.iteration = 0  # rollouts done (position in the prompt stream and RNG)
        self.ppo_updates = (
            0  # iterations with an actor update (Lightning's global_step counts both optimizers)
        )
        self.actor_steps = 0
        self.critic_steps = 0
        self.best_eval = -math.inf
        self.elapsed_seconds = 0.0  # wall time of the run's iterations and evals so far (across restarts)
        self.generated_tokens = 0.0  # response tokens sampled by training rollouts so far (all ranks)
        self.last_eval: EvalResult | None = None
        self.last_metrics: dict[str, float] = {}  # the last logged row (for summaries; not read for control)
        self.last_good_checkpoint: str | None = None
        self.max_new_tokens = cfg.ppo.max_new_tokens or task.max_new_tokens
        self.eval_set = eval_subset(task, cfg.eval_problems)
        # 'auto' pass sizes resolved once, from the model and the device's free memory (run card)
        self.cfg, self.memory_plan = resolve_memory_defaults(
            cfg, actor, critic, longest_prompt(tokenizer, self.eval_set), self.max_new_tokens
        )
        self.engine = make_engine(cfg.rollout_engine, actor, tokenizer, task=task, cfg=self.cfg)
        self._carry: dict[str, float] = {}  # metrics of events between iterations, logged with the next row
        self._resumed = False

    @property
    def actor(self):
        """The policy LM (a transformers causal LM)."""
        return self.policy.actor

    # ------------------------------------------------------------------ derived settings
    @property
    def samples_per_prompt(self) -> int:
        """1 (vanilla PPO), as the components change it (`Component.samples_per_prompt`)."""
        k = 1
        for c in self.components:
            k = c.samples_per_prompt(k)
        return k

    @property
    def prompts_per_step(self) -> int:
        return self.cfg.ppo.responses_per_step // self.samples_per_prompt

    @property
    def critic_free(self) -> bool:
        return self.critic is None

    @property
    def oracle(self):
        """The task's true state values (`ChainTask.oracle_values`) where it has them and a critic is
        measured or replaced by them; else None."""
        if self.critic_free or not getattr(self.task, "has_oracle", False):
            return None
        return self.task.oracle_values

    @property
    def sampling(self) -> SamplingParams:
        p = self.cfg.ppo
        return SamplingParams(max_new_tokens=self.max_new_tokens, temperature=p.temperature, top_p=p.top_p)

    @property
    def loss_settings(self) -> LossSettings:
        """Vanilla PPO's actor loss (ppo.eps on both sides, per response then over responses, no NLL
        term), as the components change it (`Component.loss_settings`)."""
        s = LossSettings(eps_low=self.cfg.ppo.eps, eps_high=self.cfg.ppo.eps)
        for c in self.components:
            s = c.loss_settings(s)
        return s

    def advantage_settings(self, pretraining: bool) -> AdvantageSettings:
        """Vanilla PPO's GAE (ppo.lam for the actor and the critic targets), as the components change
        it (`Component.advantage_settings`); while the critic is pretrained its targets are
        Monte-Carlo returns (lambda 1) on its own values, whatever the components say."""
        p = self.cfg.ppo
        s = AdvantageSettings(
            estimator=self.cfg.advantage_estimator,
            gamma=p.gamma,
            lam=p.lam,
            whiten=p.whiten_advantages,
            observations=self.cfg.observations,
            values=self.cfg.gae_values,
        )
        for c in self.components:
            s = c.advantage_settings(s)
        return dataclasses.replace(s, lam_critic=1.0, values="critic") if pretraining else s

    @property
    def pretrain_plan(self) -> pretrain.Plan | None:
        """The critic-only phase before PPO that a component asks for (`Component.before_ppo`), or None."""
        plan = None
        for c in self.components:
            plan = c.before_ppo(plan)
        return plan

    # ------------------------------------------------------------------ the algorithm
    def training_step(self, problems, batch_idx):
        pretraining = self.pretrain.active
        clock = [("start", time.perf_counter())]  # (part, when it ended): logged as perf/<part>_seconds
        # 1. rollout (this rank's share of the prompts; the only step that samples)
        exp = self.rollout(problems)
        clock.append(("rollout", time.perf_counter()))
        # 2. score   3. values (then the whole batch on every rank)
        score(exp, self.task.verify_batch(exp.problems, exp.texts))
        exp, sampler = self.values(exp)
        clock.append(("values", time.perf_counter()))
        # 4. advantages (and what the components compute from them)
        adv = fill_advantages(exp, self.advantage_settings(pretraining))
        extra = self.component_statistics(exp, pretraining)
        clock.append(("advantages", time.perf_counter()))
        # 5. critic update (in PPO also on the replayed batches)   6. actor update (never while the critic is
        #    pretrained: the policy stays fixed)
        critic = None if self.critic_free else self.update_critic(*self.critic_batch(exp, pretraining))
        clock.append(("critic_update", time.perf_counter()))
        actor = None if pretraining else self.update_actor(exp)
        if actor is not None:
            self.engine.load_weights(self.actor)  # the next rollout samples from the updated policy
        clock.append(("actor_update", time.perf_counter()))
        # 7. the iteration's statistics (the whole batch's), and where the run stands
        stats = self.iteration_stats(exp, adv, extra, critic=critic, actor=actor, sampler=sampler)
        self.count_iteration(stats, pretraining)
        # 8. evaluate (every eval_every PPO updates and after the last)   9. log   10. stop after cfg.steps
        if not pretraining and self.eval_due():
            self._carry.update(self.evaluate().metrics)
        self.log_iteration(stats, exp, pretraining, clock)
        if self.ppo_updates >= self.cfg.steps:
            self.trainer.should_stop = True
        return {"experience": exp}  # for the callbacks that read the iteration (vapo_lit/samples.py)

    def component_statistics(self, exp: Experience, pretraining: bool) -> dict:
        """Step 4's extra statistics: what the components compute from the filled batch
        (`Component.on_experience`); none while the critic is pretrained."""
        if pretraining:
            return {}
        return {k: v for c in self.components for k, v in c.on_experience(self, exp).items()}

    def iteration_stats(self, exp: Experience, adv, extra: dict, **updates) -> IterationStats:
        """Step 7: the iteration's statistics, stage by stage (`updates`: the critic's, the actor's and
        the sampler's; each None where that part did not run)."""
        value = None if self.critic_free else value_stats(exp, reference="mc")
        return IterationStats(rollout_stats(exp), score_stats(exp), adv, extra, value=value, **updates)

    def count_iteration(self, stats: IterationStats, pretraining: bool) -> None:
        """Step 7: where the run stands. The iteration counts as a PPO update, or as a step of the
        critic-only phase with what the stopping rule of the component that asked for it reads."""
        self.iteration += 1
        if not pretraining:
            self.ppo_updates += 1
            return
        self.pretrain.steps_done += 1
        oracle = stats.value.oracle
        self.pretrain.record(
            stats.value.explained_variance,
            *((oracle.explained_variance, oracle.ceiling) if oracle is not None else ()),
        )

    def values(self, exp: Experience) -> tuple[Experience, SamplerStats | None]:
        """Step 3: the critic's values of this rank's responses, then the whole batch gathered on every
        rank; the task's true values where it has them (their error rates from the whole batch); the
        behaviour log-probs recomputed by the update's own forward where configured, with the
        sampler-trainer gap (None when the sampler's are kept)."""
        if not self.critic_free:
            fill_values(exp, self.critic, truncation=self.cfg.truncation, chunk=self.cfg.ppo.micro_batch_size)
        exp = gather_experience(exp, pad_id_of(self.tokenizer))
        if self.oracle is not None:  # GAE's values (gae_values=oracle) or the critic's diagnostics
            fill_oracle_values(exp, self.oracle)
        # the sampler's log-probs replaced by the update's own (auto: under bf16, with vllm), their gap measured
        return exp, self.recompute_behaviour_logprobs(exp) if self.recompute_logprobs else None

    def eval_due(self) -> bool:
        """After a PPO update: every `eval_every` of them, and after the last (`steps`)."""
        return self.ppo_updates >= self.cfg.steps or bool(
            self.cfg.eval_every and self.ppo_updates % self.cfg.eval_every == 0
        )

    @torch.no_grad()
    def recompute_behaviour_logprobs(self, exp: Experience) -> SamplerStats:
        """Behaviour log-probs from the update's own numerics (kernels, padding, precision), in the first
        actor epoch's micro-batches (update_actor's stream, epoch 0), so its first ratio is exactly 1. The
        sampler's own stay in `exp.extras["sampler_logprobs"]` (truncated importance sampling reads
        them); returns how far the two are apart."""
        micros = [
            mi
            for _, ms in self._minibatches(exp.n, Stream.ACTOR_MINIBATCH, lengths=exp.lengths.cpu())
            for mi in ms
        ]
        sampled = exp.behaviour_logprobs
        exp.behaviour_logprobs = all_reduce(
            passes.micro_batch_logprobs(
                self._trained(Role.ACTOR),
                exp,
                micros,
                temperature=self.cfg.ppo.temperature,
                chunk=self.cfg.ppo.logits_chunk,
            )
        )
        exp.extras["sampler_logprobs"] = sampled
        gap = algos.sampler_mismatch(exp.behaviour_logprobs, sampled, exp.mask)
        tis = {}
        if self.cfg.ppo.tis_cap is not None:
            w = algos.truncated_is_weights(exp.behaviour_logprobs, sampled, self.cfg.ppo.tis_cap)
            tis = {
                "tis_weight_mean": float(algos.masked_mean(w.double(), exp.mask.double())),
                "tis_capped_frac": float(
                    algos.masked_mean((w >= self.cfg.ppo.tis_cap).double(), exp.mask.double())
                ),
            }
        return SamplerStats(float(gap.mean_abs), float(gap.max_abs), float(gap.approx_kl), **tis)

    def rollout(self, problems) -> Experience:
        """prompts_per_step prompts x samples_per_prompt samples from the engine (this rank's share of
        the prompt groups); in PPO iterations each component may then replace the batch
        (`Component.on_rollout`: dynamic sampling samples more rounds and keeps mixed groups)."""
        exp = self.sample(problems)
        if not self.pretrain.active:
            for c in self.components:
                exp = c.on_rollout(self, exp)
        return exp

    def sample(self, problems, round_: int = 0) -> Experience:
        """This rank's share of `problems` (whole groups), k samples each, in chunks of
        ppo.rollout_batch_size; response i is seeded by (run seed, iteration, round, i), so chunking
        and the number of ranks do not change what is sampled (round 0 is the step's own batch)."""
        k = self.samples_per_prompt
        rank, world = rank_and_world()
        share = len(problems) // world  # whole prompt groups per rank; global index = rank offset + local
        problems = list(problems)[rank * share : (rank + 1) * share]
        per_response = [pr for pr in problems for _ in range(k)]
        first = rank * share * k
        if round_ == 0:
            seeds = [
                sample_seed(self.cfg.seed, self.iteration, Stream.ROLLOUT, first + i)
                for i in range(len(per_response))
            ]
        else:
            seeds = [
                sample_seed(self.cfg.seed, self.iteration, Stream.EXTRA_ROLLOUT, round_, first + i)
                for i in range(len(per_response))
            ]
        step = self.cfg.ppo.rollout_batch_size or len(per_response)
        with self.sampling_context():
            parts = [
                self.engine.generate(
                    [pr.prompt for pr in per_response[s : s + step]], self.sampling, seeds[s : s + step]
                )
                for s in range(0, len(per_response), step)
            ]
        return Experience.from_rollout(
            concat_rollouts(parts, pad_id_of(self.tokenizer)), per_response, group_size=k
        )

    def extra_prompts(self, round_: int) -> list:
        """The prompt batch of an extra rollout round `round_` >= 1 (a component that samples more,
        `on_rollout`): a pure function of (run seed, iteration, round), so a resumed run samples what
        the uninterrupted one did."""
        seed = sample_seed(self.cfg.seed, self.iteration, Stream.EXTRA_PROMPTS, round_) & (2**63 - 1)
        return self.task.train_problems(self.prompts_per_step, seed=seed)

    def add_rollout_cost(self, tokens: float, metrics: dict) -> None:
        """For a component that samples more than the batch it keeps (`on_rollout`): the response
        tokens sampled but not kept count in perf/cumulative_tokens (the kept ones are counted when
        the iteration is logged), and `metrics` are logged with this iteration's row."""
        self.generated_tokens += tokens
        self._carry.update(metrics)

    def critic_batch(self, exp: Experience, pretraining: bool) -> tuple[Experience, int]:
        """What step 5 trains on: the iteration's batch, in PPO with the ppo.critic_replay - 1 batches
        before it, and how many batches that is."""
        if pretraining:
            return exp, 1
        return self.critic_replay.batch(exp, pad_id_of(self.tokenizer)), self.critic_replay.batches

    def update_critic(self, exp: Experience, batches: int = 1) -> CriticStats:
        """critic_epochs passes (value pretraining's own while it runs: critic_schedule) of value-loss
        steps over mini-batches; each mini-batch's loss is normalised by its own valid-token count,
        summed over its micro-batches (and ranks). `exp` holding `batches` replayed batches, each
        mini-batch takes critic_mini_batch_size responses per batch: as many steps, over more responses."""
        world, p = rank_and_world()[1], self.cfg.ppo
        size = (p.critic_mini_batch_size or p.mini_batch_size) * batches
        losses, norms = [], []
        for epoch in range(self.critic_schedule()[1]):
            for idx, micros in self._minibatches(
                exp.n, Stream.CRITIC_MINIBATCH + epoch, lengths=exp.lengths.cpu(), size=size
            ):
                den, total = exp.mask[idx].sum(), 0.0
                for j, mi in enumerate(micros):
                    mb = exp.select(mi, trim=True)
                    with self.data_parallel.grad_sync(Role.CRITIC, last=j == len(micros) - 1):
                        v = passes.state_values(
                            self._trained(Role.CRITIC), mb.input_ids, mb.attention_mask, mb.prompt_width
                        )[:, :-1]
                        loss = algos.value_loss(
                            v,
                            mb.returns,
                            mb.mask,
                            old_values=mb.values,
                            clip_range=p.value_clip,
                            denominator=den,
                        )
                        self.manual_backward(loss * world)  # DDP averages over ranks: the sum is wanted
                    total += loss.item()
                norms.append(self._optimizer_step(Role.CRITIC, total, finite=math.isfinite(total)))
                losses.append(total)
        loss_sum = all_reduce(torch.tensor(losses, dtype=torch.float64)) if losses else torch.zeros(0)
        return CriticStats(loss=mean(loss_sum.tolist()), grad_norm=mean(norms))

    def update_actor(self, exp: Experience) -> ActorStats:
        """ppo_epochs passes of clipped-policy steps over mini-batches. The token-level and the
        positive-NLL denominators count the whole mini-batch, so micro-batches (and ranks) add up
        exactly."""
        world, aggregation = rank_and_world()[1], self.loss_settings.aggregation
        sums, norms, shares = ActorStats.sums(), [], []
        for epoch in range(self.cfg.ppo.ppo_epochs):
            for idx, micros in self._minibatches(
                exp.n, Stream.ACTOR_MINIBATCH + epoch, lengths=exp.lengths.cpu()
            ):
                m = exp.mask[idx]
                tokens = m.sum()
                den = tokens if aggregation == "token" else (m.sum(1) > 0).sum()
                pos_den = (m * exp.positive[idx, None]).sum()
                shares.append(loss_share_by_length(exp, idx, aggregation, den))
                for j, mi in enumerate(micros):
                    mb = exp.select(mi, trim=True)
                    with self.data_parallel.grad_sync(Role.ACTOR, last=j == len(micros) - 1):
                        loss, stats = self.actor_loss(mb, den=den, pos_den=pos_den, tokens=tokens)
                        self.manual_backward(loss * world)  # DDP averages over ranks: the sum is wanted
                    sums.add(
                        float(mb.mask.sum()) / float(tokens), **stats
                    )  # its share of the tokens (float64)
                norms.append(
                    self._optimizer_step(Role.ACTOR, sums.totals["loss/policy"], finite=sums.finite())
                )
        return ActorStats.reduce(sums, norms, shares)

    def actor_loss(self, mb: Experience, *, den, pos_den, tokens) -> tuple[torch.Tensor, dict]:
        """One micro-batch's actor loss under `loss_settings`: the clipped policy loss normalised by
        `den` (+ mu * the positive NLL over `pos_den` tokens, + the components' terms over the
        mini-batch's `tokens`), and its statistics as `MicroBatchSums.add` takes them."""
        s, p = self.loss_settings, self.cfg.ppo
        logp, ent = self._trained(Role.ACTOR)(
            mb.input_ids,
            mb.attention_mask,
            mb.prompt_width,
            mb.response_ids,
            temperature=p.temperature,
            entropy=True,
            chunk=p.logits_chunk,
        )
        tis = (
            None  # truncated importance sampling: the sampler's draws reweighted towards the trainer's policy
        )
        if p.tis_cap is not None and "sampler_logprobs" in mb.extras:
            tis = algos.truncated_is_weights(mb.behaviour_logprobs, mb.extras["sampler_logprobs"], p.tis_cap)
        pg_loss, st = algos.policy_loss(
            logp,
            mb.behaviour_logprobs,
            mb.advantages,
            mb.mask,
            eps_low=s.eps_low,
            eps_high=s.eps_high,
            aggregation=s.aggregation,
            denominator=den,
            is_weights=tis,
        )
        loss, nll = pg_loss, torch.zeros((), device=logp.device, dtype=logp.dtype)
        if s.mu is not None:
            nll = algos.positive_nll(logp, mb.mask, mb.positive, denominator=pos_den)[0]
            loss = loss + s.mu * nll
        weighted = {
            "policy/entropy": algos.masked_mean(ent, mb.mask),
            "policy/clipfrac_low": st.clipfrac_low,
            "policy/clipfrac_high": st.clipfrac_high,
            "policy/approx_kl": st.approx_kl,
            "policy/ratio_mean": st.ratio_mean,
        }
        for c in self.components:
            term = c.loss_term(self, mb, logp, tokens)
            if term is not None:
                loss = loss + term[0]
                weighted.update(term[1])
        totals = {"loss/policy": pg_loss.detach(), "loss/nll": nll.detach(), "loss/total": loss.detach()}
        return loss, {"weighted": weighted, "totals": totals, "peaks": {"policy/ratio_max": st.ratio_max}}

    def _optimizer_step(self, role: Role, loss: float, finite: bool) -> float:
        """The step after a mini-batch's backward passes: every rank stops if any rank's loss is not
        `finite`; then clip (returns the norm before clipping, for the logs), step, zero the
        gradients, advance the schedule and the step counter."""
        opt, sch = self._opt(role.optimizer_index)
        self._agree_finite(role.loss_metric, finite, loss)
        norm = self._clip(opt, self.actor if role is Role.ACTOR else self.critic)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sch.step()
        if role is Role.ACTOR:
            self.actor_steps += 1
        else:
            self.critic_steps += 1
        return norm

    # ------------------------------------------------------------------ data parallel
    def configure_model(self) -> None:
        """Under FSDP the policy and the critic are sharded here, before the optimizers exist."""
        if is_fsdp_strategy(self.trainer.strategy) and not self.data_parallel:
            self.set_data_parallel(lambda m: shard_model(m, self.trainer.precision))

    def set_data_parallel(self, wrap) -> None:
        """Called by a data-parallel strategy: `wrap(module)` returns its DDP/FSDP wrapper. The
        training forwards then go through the wrappers (`self.data_parallel`)."""
        models = {Role.ACTOR: self.policy}
        if not self.critic_free:
            models[Role.CRITIC] = self.critic
        self.data_parallel.wrap(models, wrap)

    def _trained(self, role: Role):
        """The model the update's forward runs through: its data-parallel wrapper if any."""
        return self.data_parallel.model(role, self.policy if role is Role.ACTOR else self.critic)

    def _fsdp_lazy_init(self) -> None:
        """One tiny forward through each sharded root before sampling calls the blocks directly."""
        device = next(self.actor.parameters()).device
        ids = torch.full((1, 2), pad_id_of(self.tokenizer), dtype=torch.long, device=device)
        self.data_parallel.lazy_init(
            {
                Role.ACTOR: lambda m: m(ids, torch.ones_like(ids), 1, ids[:, 1:], 1.0),
                Role.CRITIC: lambda m: m(ids, torch.ones_like(ids)),
            }
        )

    @contextlib.contextmanager
    def sampling_context(self):
        """Sampling (rollouts and every eval) runs outside Lightning's autocast, in the weights' own
        dtype; token by token it needs the whole actor: gathered for it under FSDP."""
        with autocast_off(), self.data_parallel.gathered(Role.ACTOR):
            yield

    @property
    def recompute_logprobs(self) -> bool:
        """ppo.recompute_logprobs, None ('auto') resolved: on under any reduced precision (devices.py)."""
        precision = self._trainer.precision if self._trainer is not None else None
        return recompute_logprobs(self.cfg, precision, next(self.actor.parameters()).dtype)

    def _agree_finite(self, name: str, finite: bool, value: float) -> None:
        """Every rank stops together when any rank's loss is not finite (a lone raise would hang the rest)."""
        if agree_any(not finite):
            self._check_finite(name, torch.tensor(value if not finite else float("nan")))

    # ------------------------------------------------------------------ value pretraining (the phase)
    def on_fit_start(self) -> None:
        self._fsdp_lazy_init()
        for i in range(len(self.optimizers()) if isinstance(self.optimizers(), list) else 1):
            adam_state(self._opt(i)[0])
        if self._resumed:  # the checkpoint holds the phase. (A strategy that restores after this hook, FSDP,
            return  # overwrites the phase, critic, optimizer and counters set below with the checkpoint's.)
        if self.pretrain_plan is not None and not (self.pretrain.active or self.pretrain.finished):
            cached = pretrain.restore(self.pretrain_key(), self.cfg.cache_dir, self.critic)
            if cached is None:
                self.pretrain.active = True
                self._reset_critic_optimizer()  # value pretraining's own learning rate
                return
            self._reset_critic_optimizer()
            self.pretrain = cached
            self.iteration = cached.steps_done  # the same prompt stream as a run that pretrained
            self._carry.update(cached.log())

    def end_value_pretraining(self) -> None:
        """Called by the component that asked for the phase when its stopping rule says so."""
        ph = self.pretrain
        ph.active, ph.finished = False, True
        self._reset_critic_optimizer()
        self._carry.update(ph.log())
        pretrain.store(self.pretrain_key(), self.cfg.cache_dir, self.critic, ph)

    def pretrain_key(self) -> dict:
        """The pretrained critic's cache key: the config and what the phase's plan asks for."""
        plan = self.pretrain_plan
        return pretrain.cache_key(
            self.cfg,
            steps=plan.value_pretrain_steps,
            min_ev=plan.value_pretrain_min_ev,
            samples_per_prompt=self.samples_per_prompt,
            max_new_tokens=self.max_new_tokens,
            task_version=getattr(self.task, "version", "?"),
            ev_window=plan.value_pretrain_ev_window,
        )

    def critic_schedule(self, pretraining: bool | None = None) -> tuple[float, int]:
        """The critic's (learning rate, passes per batch): the phase plan's own while the critic is
        pretrained (each None: the PPO ones), ppo.critic_lr and ppo.critic_epochs otherwise."""
        p = self.cfg.ppo
        if not (self.pretrain.active if pretraining is None else pretraining):
            return p.critic_lr, p.critic_epochs
        return pretrain.phase_critic(p, self.pretrain_plan)

    def _reset_critic_optimizer(self) -> None:
        """A fresh critic optimiser and schedule at the phase's learning rate (critic_schedule): when
        value pretraining starts, and when PPO starts after it, whether the pretrained critic was just
        trained or loaded from the cache (so both runs match)."""
        opt, sch = self._opt(1)
        adam_state(opt, reset=True)
        sch.last_epoch = 0
        sch.base_lrs = [self.critic_schedule()[0] for _ in sch.base_lrs]
        for group, base, fn in zip(sch.optimizer.param_groups, sch.base_lrs, sch.lr_lambdas):
            group["initial_lr"] = base
            group["lr"] = base * fn(0)

    # ------------------------------------------------------------------ logging and evaluation
    def log_iteration(self, stats: IterationStats, exp: Experience, pretraining: bool, clock: list) -> None:
        """One row: the iteration's statistics, its timings (`clock`: (part, perf_counter at its end)
        in order, from ("start", t0) to the actor update), the run's counters and what `_carry` holds."""
        metrics, tokens = stats.log(), float(exp.mask.sum())
        t0, t_rollout, t_update = clock[0][1], dict(clock)["rollout"], clock[-1][1]
        metrics.update(
            {f"perf/{part}_seconds": end - before for (_, before), (part, end) in zip(clock, clock[1:])}
        )
        metrics.update(
            {
                "perf/update_seconds": t_update - t_rollout,
                "perf/step_seconds": t_update - t0,
                "perf/tokens_per_second": tokens / max(t_update - t0, 1e-9),
                "train/iteration": self.iteration,
                "train/ppo_update": self.ppo_updates,
                "train/value_pretraining": float(pretraining),
                "train/actor_lr": self._opt(0)[0].param_groups[0]["lr"],
            }
        )
        if not self.critic_free:
            metrics["train/critic_lr"] = self._opt(1)[0].param_groups[0]["lr"]
        metrics.update(self._carry)
        self._carry = {}
        metrics["perf/total_seconds"] = time.perf_counter() - t0
        self.elapsed_seconds += metrics["perf/total_seconds"]
        self.generated_tokens += tokens
        if pretraining:  # the phase's own cost, cached with the critic
            self.pretrain.seconds += metrics["perf/total_seconds"]
            self.pretrain.tokens += tokens
        metrics.update(
            {
                "perf/cumulative_seconds": self.elapsed_seconds,
                "perf/cumulative_tokens": self.generated_tokens,
                "perf/peak_memory_mb": peak_memory_mb(exp.mask.device),
            }
        )
        self.last_metrics = metrics
        self._log(metrics, step=self.iteration)

    def on_train_start(self) -> None:
        if self.trainer.world_size > 1 and hasattr(
            self.engine, "start"
        ):  # an engine whose build is a collective:
            world = self.trainer.world_size  # every rank here, the weights restored
            self.engine.start(
                -(-self.cfg.ppo.responses_per_step // world), share=world // self.trainer.num_nodes
            )
        if not self._resumed:  # the initial policy's eval: its own row, step 0
            # seeded as iteration 0 even when a cached pretrained critic moved the iteration on, so
            # every run of one seed reports the same base eval
            metrics = {**self.evaluate(at=0).metrics, "train/iteration": 0, "train/ppo_update": 0}
            self.elapsed_seconds += metrics["perf/eval_seconds"]
            metrics.update({"perf/cumulative_seconds": self.elapsed_seconds, "perf/cumulative_tokens": 0.0})
            self._log(metrics, step=0)
            if self.pretrain.from_cache:  # the cached phase's cost counts as this run's, as if computed here
                self.elapsed_seconds += self.pretrain.seconds
                self.generated_tokens += self.pretrain.tokens

    def _log(self, metrics: dict, step: int) -> None:
        for logger in self.loggers:
            logger.log_metrics(metrics, step=step)
            logger.save()  # a killed run keeps every finished iteration

    @torch.no_grad()
    def evaluate(self, at: int | None = None) -> EvalResult:
        """eval/... of the current actor; sampling seeded by iteration `at` (default: the current one)."""
        t0 = time.perf_counter()
        seed = sample_seed(self.cfg.seed, self.iteration if at is None else at, Stream.EVAL)
        sampling = SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.cfg.eval_temperature,
            top_p=self.cfg.eval_top_p,
        )
        batch = self.cfg.ppo.rollout_batch_size or 256
        with self.sampling_context():
            samples = sample_responses(
                self.engine,
                self.task,
                self.eval_set,
                k=self.cfg.eval_k,
                sampling=sampling,
                seed=seed,
                batch_size=batch,
                shard=rank_and_world(),
            )
        stats = summarize(self.task, self.eval_set, samples, self.cfg.eval_k)
        metrics = {**stats.log(), "perf/eval_seconds": time.perf_counter() - t0}
        value, is_best = stats.avg, stats.avg > self.best_eval
        if is_best:
            self.best_eval = value
            metrics["eval/is_best"] = 1.0
        self.last_eval = EvalResult(self.iteration, self.ppo_updates, value, is_best, metrics, tuple(samples))
        return self.last_eval

    # ------------------------------------------------------------------ Lightning plumbing
    def configure_optimizers(self):
        p = self.cfg.ppo
        opts = [torch.optim.AdamW(self.actor.parameters(), lr=p.actor_lr, weight_decay=p.weight_decay)]
        warmups = [p.warmup_steps]
        if not self.critic_free:
            opts.append(
                torch.optim.AdamW(self.critic.parameters(), lr=p.critic_lr, weight_decay=p.weight_decay)
            )
            warmups.append(p.warmup_steps if p.critic_warmup_steps is None else p.critic_warmup_steps)
        clear_autocast_cache_after_steps(opts)
        return opts, [
            torch.optim.lr_scheduler.LambdaLR(o, warmup_then_constant(w)) for o, w in zip(opts, warmups)
        ]

    def _opt(self, i: int):
        """(optimizer, scheduler) i: 0 = actor, 1 = critic (Lightning unwraps single lists)."""
        opts, schs = self.optimizers(), self.lr_schedulers()
        opts = opts if isinstance(opts, list) else [opts]
        schs = schs if isinstance(schs, list) else [schs]
        return opts[i], schs[i]

    def _minibatches(self, N: int, stream: int, lengths: torch.Tensor | None = None, size: int | None = None):
        """Shuffled mini-batches of `size` responses (None: mini_batch_size; seeded by the iteration
        and `stream`, a `Stream` plus the epoch; the same on every rank) and this rank's micro-batches of each: its contiguous 1/W slice of
        the mini-batch, ordered by response length (`lengths`, when given) and split by micro_batch_size."""
        g = torch.Generator().manual_seed(step_seed(self.cfg.seed, self.iteration, stream))
        perm = torch.randperm(N, generator=g)
        mb, micro = size or self.cfg.ppo.mini_batch_size, self.cfg.ppo.micro_batch_size
        rank, world = rank_and_world()
        for s in range(0, N, mb):
            idx = perm[s : s + mb]
            share = len(idx) // world
            mine = idx[rank * share : (rank + 1) * share]
            if lengths is not None and micro < len(mine):  # similar lengths share a micro-batch: less padding
                mine = mine[torch.sort(lengths[mine], descending=True, stable=True).indices]
            yield idx, [mine[k : k + micro] for k in range(0, len(mine), micro)]

    def _clip(self, opt, model) -> float:
        """The gradient norm before clipping (logged), then Lightning's clipping to ppo.grad_clip."""
        grads = [q.grad for q in model.parameters() if q.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)
        if hasattr(norm, "full_tensor"):  # sharded gradients (FSDP): the norm over all shards
            norm = norm.full_tensor()
        self._check_finite("grad_norm", norm)
        if self.cfg.ppo.grad_clip > 0:
            self.clip_gradients(opt, gradient_clip_val=self.cfg.ppo.grad_clip, gradient_clip_algorithm="norm")
        return float(norm)

    def _check_finite(self, name: str, t: torch.Tensor) -> None:
        if not bool(torch.isfinite(t).all()):
            raise NonFiniteLossError(
                f"{name} is {t.detach().flatten()[:4].tolist()} (not finite) at iteration {self.iteration} "
                f"(PPO update {self.ppo_updates}, {'value pretraining' if self.pretrain.active else 'PPO'}); "
                f"the run stops here. Last good checkpoint: {self.last_good_checkpoint or 'none saved yet'}"
            )

    def train_dataloader(self):
        stream = PromptStream(self.task, self.prompts_per_step, self.cfg.seed, start=self.iteration)
        return DataLoader(stream, batch_size=None, collate_fn=lambda x: x)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch  # a list of Problems (text): nothing to move

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["vapo"] = {
            "iteration": self.iteration,
            "ppo_updates": self.ppo_updates,
            "actor_steps": self.actor_steps,
            "critic_steps": self.critic_steps,
            "best_eval": self.best_eval,
            "pretrain": self.pretrain.state_dict(),
            "critic_replay": self.critic_replay.state_dict(),
            "switches": to_dict(self.switches),
            "config": to_dict(self.cfg),
            "carry": dict(self._carry),
            "elapsed_seconds": self.elapsed_seconds,
            "generated_tokens": self.generated_tokens,
            "rng": {"python": random.getstate(), "torch": torch.get_rng_state()},
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        s = checkpoint["vapo"]
        self.iteration, self.ppo_updates = s["iteration"], s["ppo_updates"]
        self.actor_steps, self.critic_steps = s["actor_steps"], s["critic_steps"]
        self.best_eval = s["best_eval"]
        self.pretrain.load_state_dict(s["pretrain"])
        self.critic_replay.load_state_dict(s.get("critic_replay", {}))
        self._carry = dict(s.get("carry", {}))  # e.g. value_pretrain/* waiting for the next row
        self.elapsed_seconds, self.generated_tokens = (
            s.get("elapsed_seconds", 0.0),
            s.get("generated_tokens", 0.0),
        )
        self._resumed = True
        random.setstate(s["rng"]["python"])
        torch.set_rng_state(s["rng"]["torch"])


def warmup_then_constant(steps: int):
    """The learning-rate factor of optimizer step s: a linear warmup over `steps`, then 1."""
    warm = max(1, steps)
    return lambda step: min(1.0, (step + 1) / warm)


def adam_state(opt, reset: bool = False) -> None:
    """Create (or, with `reset`, zero) the AdamW state of every parameter: moments 0, step 0, what a
    fresh AdamW creates lazily at its first step. Created eagerly so that every strategy checkpoints
    the same thing: torch.distributed.checkpoint (FSDP) would otherwise initialise an empty state
    with a zero-gradient step, which counts as a step (and shifts Adam's bias correction)."""
    opt = getattr(opt, "optimizer", opt)
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state[p]
            if st and not reset:
                continue
            st["step"] = torch.tensor(
                0.0, dtype=torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
            )
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if group.get("amsgrad"):
                st["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def peak_memory_mb(device) -> float:
    """Peak memory so far: allocated GPU memory on CUDA, else the process's peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
