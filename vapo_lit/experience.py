"""One PPO iteration as data: an `Experience` and the pure stages that fill it.

    exp = Experience.from_rollout(rollout, problems, group_size=k)   # 1. rollout
    score(exp, task.verify_batch(exp.problems, exp.texts))          # 2. score -> ScoreStats
    fill_values(exp, critic)                                        # 3. values (critic-based rows)
    adv_stats = fill_advantages(exp, settings)                      # 4. advantages -> AdvantageStats
    rollout_stats(exp), score_stats(exp), value_stats(exp, "mc")    # the batch's typed statistics

Each stage fills its fields of the `Experience` and returns its own typed statistics; nothing is
passed through a metrics dictionary. The stages are torch only: the critic enters `fill_values`
as any callable (so a test can hand it a stub with known per-column outputs). Shapes: N responses, P prompt
columns (left-padded), R response columns (right-padded); see `vapo_lit.passes` for the column
convention of values and log-probs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import torch

from vapo_lit import algos, passes

TRUNCATION = ("terminal", "bootstrap")
"""How a response cut by the length limit ends: scored and treated as terminal (verl's choice,
docs/algorithm.md's default), or bootstrapped from V(state after its last token)."""

POSITION_EDGES = (1, 8, 32, 128, 512)
"""Response-position buckets of value/bias: first token, 1-7, 8-31, 32-127, 128-511, 512+."""
LENGTH_EDGES = (20, 50, 100, 200, 500, 1000)
"""Response-length buckets (action tokens) of value/bias and of the length diagnostics of GAE and
the actor loss: <20 (lambda 0 at alpha 0.05), 20-49, 50-99, 100-199, 200-499, 500-999, 1000+."""


@dataclass
class Experience:
    """Everything one PPO iteration knows about its N sampled responses."""

    # ---- 1. rollout (from the engine)
    problems: list
    """(N) the problem each response answers; the `group_size` samples of one prompt are adjacent."""
    group_size: int
    """Samples per prompt (1 without group sampling)."""
    prompt_ids: torch.Tensor
    """(N, P) long, LEFT-padded with the pad id."""
    prompt_mask: torch.Tensor
    """(N, P) long, 1 on real prompt tokens."""
    response_ids: torch.Tensor
    """(N, R) long, RIGHT-padded; includes the EOS token when one was emitted."""
    mask: torch.Tensor
    """(N, R) float, 1.0 on the policy's response tokens (EOS included), 0.0 on padding: the ACTION
    mask, so every loss, statistic and token count reads action tokens only (0 on observations)."""
    behaviour_logprobs: torch.Tensor
    """(N, R) log pi_behaviour of each sampled token, recorded at sampling time; 0 on padding."""
    lengths: torch.Tensor
    """(N,) long, response tokens (EOS included; observation tokens too in a multi-turn episode)."""
    truncated: torch.Tensor
    """(N,) bool, hit the length limit without EOS."""
    texts: list
    """(N) decoded responses."""
    obs_mask: torch.Tensor | None = None
    """(N, R) float, 1.0 on observation tokens an environment wrote (multi-turn); None single-turn."""
    # ---- 2. score
    scores: torch.Tensor | None = None
    """(N,) float verifier reward (0/1; 0 when the verifier failed)."""
    rewards: torch.Tensor | None = None
    """(N, R) the score on each response's last token, 0 elsewhere."""
    verdicts: list | None = None
    """(N) the verifier's verdicts (errors and the strict check)."""
    # ---- 3. values (critic-based rows only)
    values: torch.Tensor | None = None
    """(N, R) V(s_t) before each response token at sampling time; 0 on padding."""
    bootstrap: torch.Tensor | None = None
    """(N,) value after the last token: V(s_l) for a truncated row with truncation=bootstrap, else 0."""
    oracle_values: torch.Tensor | None = None
    """(N, R) the task's true V*(s_t) (success probability from each state under the sampling
    policy) where the task can compute it (longchain), for GAE with `gae_values=oracle` and the
    critic's quality; 0 on padding; None elsewhere."""
    oracle_rates: dict | None = None
    """The per-kind error rates the oracle measured on this batch (kind -> rate)."""
    # ---- 4. advantages
    lam_policy: torch.Tensor | None = None
    """(N,) the actor's GAE lambda per response (None without a critic)."""
    advantages: torch.Tensor | None = None
    """(N, R) actor advantages (whitened when configured); 0 on padding."""
    returns: torch.Tensor | None = None
    """(N, R) critic targets V + A(lambda_critic); 0 on padding (None without a critic)."""
    mc_returns: torch.Tensor | None = None
    """(N, R) Monte-Carlo returns (lambda = 1) for the critic diagnostics (None without a critic)."""
    extras: dict = field(default_factory=dict)
    """Room for a new component's per-iteration tensors (e.g. reference log-probs for a KL penalty)."""

    # ------------------------------------------------------------------ construction and views
    @classmethod
    def from_rollout(cls, rollout, problems: list, group_size: int = 1) -> "Experience":
        if len(problems) != len(rollout.texts):
            raise ValueError(f"{len(problems)} problems for {len(rollout.texts)} responses")
        action = getattr(rollout, "action_mask", None)
        return cls(
            problems=list(problems),
            group_size=group_size,
            prompt_ids=rollout.prompt_ids,
            prompt_mask=rollout.prompt_mask,
            response_ids=rollout.response_ids,
            mask=rollout.response_mask if action is None else action,
            behaviour_logprobs=rollout.logprobs,
            lengths=rollout.lengths,
            truncated=rollout.truncated,
            texts=list(rollout.texts),
            obs_mask=None if action is None else rollout.response_mask - action,
        )

    @property
    def n(self) -> int:
        return self.mask.shape[0]

    @property
    def prompt_width(self) -> int:
        """P: the column of the first response token."""
        return self.prompt_ids.shape[1]

    @property
    def input_ids(self) -> torch.Tensor:
        """(N, P + R) prompt and response."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def token_mask(self) -> torch.Tensor:
        """(N, R) float, 1.0 on every real response token: actions and observations."""
        return self.mask if self.obs_mask is None else self.mask + self.obs_mask

    @property
    def attention_mask(self) -> torch.Tensor:
        """(N, P + R) long mask of real tokens."""
        return torch.cat([self.prompt_mask.long(), self.token_mask.long()], dim=1)

    @property
    def positive(self) -> torch.Tensor:
        """(N,) bool: correct responses (the positive-example NLL set)."""
        return self.scores > 0

    def select(self, idx: torch.Tensor, trim: bool = False) -> "Experience":
        """The rows `idx` (a mini- or micro-batch) as an Experience of their own. With `trim`, the
        columns no selected row uses are cut off (leading prompt padding, trailing response
        padding), so a micro-batch of short responses costs a short forward pass."""
        rows = idx.tolist()
        P, R = self.prompt_width, self.mask.shape[1]
        p_cut, r_keep = 0, R
        if trim and len(rows):
            p_cut = P - int(self.prompt_mask[idx].sum(1).max())
            r_keep = max(1, int(self.lengths[idx].max()))

        def take(t):
            t = t[idx]
            return t[:, :r_keep] if t.dim() >= 2 and t.shape[1] == R and r_keep < R else t

        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in ("prompt_ids", "prompt_mask"):
                out[f.name] = v[idx][:, p_cut:]
            elif isinstance(v, torch.Tensor):
                out[f.name] = take(v)
            elif isinstance(v, list):
                out[f.name] = [v[i] for i in rows]
            elif f.name == "extras":
                out[f.name] = {k: take(t) if isinstance(t, torch.Tensor) else t for k, t in v.items()}
            else:
                out[f.name] = v
        return Experience(**out)


# ----------------------------------------------------------------------------- 2. score
@dataclass(frozen=True)
class ScoreStats:
    score: float
    accuracy: float
    strict_accuracy: float
    positive_responses: int
    positive_tokens: int
    verifier_errors: int
    mixed_groups_frac: float | None

    def log(self) -> dict[str, float]:
        out = {
            "objective/score": self.score,
            "objective/accuracy": self.accuracy,
            "objective/strict_accuracy": self.strict_accuracy,
            "rollout/positive_responses": float(self.positive_responses),
            "rollout/positive_tokens": float(self.positive_tokens),
            "rollout/verifier_errors": float(self.verifier_errors),
        }
        if self.mixed_groups_frac is not None:
            out["rollout/mixed_groups_frac"] = self.mixed_groups_frac
        return out


def score(exp: Experience, verdicts: list) -> ScoreStats:
    """The verifier's reward as the outcome on each response's last token (its last ACTION token in
    a multi-turn episode: an observation is no timestep of the policy)."""
    if len(verdicts) != exp.n:
        raise ValueError(f"{len(verdicts)} verdicts for {exp.n} responses")
    device = exp.mask.device
    scores = torch.tensor([v.reward for v in verdicts], dtype=torch.float32, device=device)  # (N,)
    if exp.obs_mask is None:
        last, has = (exp.lengths - 1).clamp(min=0), exp.lengths > 0
    else:
        cols = torch.arange(exp.mask.shape[1], device=device)
        last, has = (exp.mask * (cols + 1)).argmax(1), exp.mask.sum(1) > 0
    rewards = torch.zeros(exp.mask.shape, dtype=scores.dtype, device=device)
    rewards[torch.arange(exp.n, device=device), last] = scores * has
    exp.scores, exp.rewards, exp.verdicts = scores, rewards, list(verdicts)
    return score_stats(exp)


def score_stats(exp: Experience) -> ScoreStats:
    """The score stage's statistics of a scored Experience."""
    scores, verdicts = exp.scores, exp.verdicts
    pos = scores > 0
    stricts = [float(bool(v.strict)) for v in verdicts if v.strict is not None]
    mixed = None
    if exp.group_size > 1:  # how many groups hold both a right and a wrong answer
        g = scores.view(-1, exp.group_size)
        mixed = float(((g.max(1).values > 0) & (g.min(1).values == 0)).float().mean())
    return ScoreStats(
        score=float(scores.mean()),
        accuracy=float(pos.float().mean()),
        strict_accuracy=sum(stricts) / len(stricts) if stricts else float("nan"),
        positive_responses=int(pos.sum()),
        positive_tokens=int(action_lengths(exp)[pos].sum()),
        verifier_errors=sum(v.error is not None for v in verdicts),
        mixed_groups_frac=mixed,
    )


def action_lengths(exp: Experience) -> torch.Tensor:
    """(N,) the policy's own tokens per response (all response tokens without observations)."""
    return exp.lengths if exp.obs_mask is None else exp.mask.sum(1).long()


# ----------------------------------------------------------------------------- 3. values
Critic = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
"""(input_ids (n, P + R), attention_mask) -> (n, P + R) values, column c = V(prefix ending at c)
(the `ValueModel` convention; a test may pass a stub with known per-column outputs).
`passes.state_values` calls it with rows moved left by their prompt padding and no mask (None):
a causal pass whose positions are the columns (see vapo_lit.passes)."""


@torch.no_grad()
def fill_values(
    exp: Experience, critic: Critic, *, truncation: str = "terminal", chunk: int | None = None
) -> None:
    """V(s_t) of every response token at sampling time, and the value after the last token of the
    rows the length limit cut (only with truncation='bootstrap'; 0 for every other row).
    `chunk` rows per critic forward (None: all at once), taken in order of length and each cut to
    its longest response (a chunk of short responses costs a short pass)."""
    if truncation not in TRUNCATION:
        raise ValueError(f"truncation={truncation!r} is not valid; choose one of: {', '.join(TRUNCATION)}")
    n, P, R = exp.n, exp.prompt_width, exp.mask.shape[1]
    ids, attn = exp.input_ids, exp.attention_mask
    order = torch.sort(exp.lengths, descending=True, stable=True).indices
    v_state = None  # (N, R + 1): V(s_0) .. V(s_R)
    for rows in order.split(chunk or n):
        keep = max(1, int(exp.lengths[rows].max()))  # response columns any of these rows uses
        v = passes.state_values(critic, ids[rows, : P + keep], attn[rows, : P + keep], P)  # (k, keep + 1)
        if v_state is None:
            v_state = v.new_zeros((n, R + 1))
        v_state[rows.to(v.device), : keep + 1] = v
    exp.values = (
        v_state[:, :-1] * exp.token_mask
    )  # on observation tokens too (GAE's `step` setting reads them)
    after_last = v_state[torch.arange(n, device=v_state.device), exp.lengths]
    cut = exp.truncated if truncation == "bootstrap" else torch.zeros_like(exp.truncated)
    exp.bootstrap = torch.where(cut, after_last, torch.zeros_like(after_last))


Oracle = Callable[[list, torch.Tensor, torch.Tensor], tuple]
"""(problems, response_ids (N, R), lengths (N,)) -> (V* (N, R), {kind: error rate}): the task's
true state values (`ChainTask.oracle_values`)."""


@torch.no_grad()
def fill_oracle_values(exp: Experience, oracle: Oracle) -> None:
    """The true V*(s_t) of every response token (in the dtype of the critic's values, float32
    without a critic), and the error rates it was computed from."""
    values, rates = oracle(exp.problems, exp.response_ids, exp.lengths)
    dtype = exp.values.dtype if exp.values is not None else torch.float32
    exp.oracle_values, exp.oracle_rates = values.to(dtype) * exp.mask, dict(rates)


# ----------------------------------------------------------------------------- 4. advantages
@dataclass(frozen=True)
class AdvantageSettings:
    """Which GAE the iteration uses: vanilla PPO's as the components change it
    (`Component.advantage_settings`; see VapoModule.advantage_settings)."""

    estimator: str = "gae"
    """gae (critic-based) or grpo (critic-free, group-normalised outcome)."""
    gamma: float = 1.0
    lam: float = 0.95
    """The fixed lambda (vanilla PPO) when `alpha` is None."""
    alpha: float | None = None
    """Length-adaptive GAE: lambda_policy = 1 - 1/(alpha * l) per response."""
    lam_critic: float | None = None
    """The critic targets' lambda; None: the policy's (one lambda for both)."""
    whiten: bool = True
    """Normalise the actor advantages over the batch's valid tokens (critic targets never)."""
    observations: str = "skip"
    """How GAE crosses observation spans of multi-turn episodes: skip, step or zero (docs/algorithm.md)."""
    values: str = "critic"
    """The state values GAE reads: the critic's (critic) or the task's true ones (oracle)."""


@dataclass(frozen=True)
class LossSettings:
    """How the actor update builds its loss: vanilla PPO's as the components change it
    (`Component.loss_settings`; see VapoModule.loss_settings)."""

    eps_low: float = 0.2
    eps_high: float = 0.2
    """The ratio is clipped to [1 - eps_low, 1 + eps_high]."""
    aggregation: str = "sample"
    """The policy loss over all valid tokens of the mini-batch ("token") or per response, then over
    responses ("sample")."""
    mu: float | None = None
    """The weight of the positive-example NLL added to the loss; None: no such term."""


@dataclass(frozen=True)
class AdvantageStats:
    lambda_policy_mean: float | None = None
    lambda_policy_min: float | None = None
    lambda_policy_max: float | None = None
    lambda_policy_clamped: int = 0
    advantage_by_turn: dict | None = None
    """Multi-turn episodes: turn label -> mean actor advantage of that turn's action tokens."""
    by_length: dict | None = None
    """Response-length bucket (LENGTH_EDGES) -> {lambda_policy: its responses' mean lambda,
    adv_bias: mean(A - A_mc), adv_var: Var(A), adv_var_mc: Var(A_mc)} over its tokens, where A
    is the actor advantage before whitening and A_mc = G - V the Monte-Carlo one (lambda = 1);
    buckets without a response left out; None critic-free."""

    def log(self) -> dict[str, float]:
        out = (
            {}
            if self.advantage_by_turn is None
            else {f"gae/advantage_{k}": v for k, v in self.advantage_by_turn.items()}
        )
        for label, stats in (self.by_length or {}).items():
            out.update({f"gae/{name}_len_{label}": v for name, v in stats.items()})
        if self.lambda_policy_mean is None:
            return out
        return {
            "gae/lambda_policy_mean": self.lambda_policy_mean,
            "gae/lambda_policy_min": self.lambda_policy_min,
            "gae/lambda_policy_max": self.lambda_policy_max,
            "gae/lambda_policy_clamped": float(self.lambda_policy_clamped),
            **out,
        }


@torch.no_grad()
def fill_advantages(exp: Experience, s: AdvantageSettings) -> AdvantageStats:
    """Decoupled GAE from one sweep over the TD residuals: actor advantages with lambda_policy,
    critic targets with lambda_critic; Monte-Carlo returns beside them for the diagnostics.
    Critic-free (grpo): the group-normalised outcome on every token, no targets."""
    if s.estimator == "grpo":
        exp.advantages = algos.group_normalized_advantage(exp.scores, exp.mask, exp.group_size)
        return AdvantageStats(advantage_by_turn=advantage_by_turn(exp))
    if s.values == "oracle":
        if exp.oracle_values is None:
            raise ValueError("GAE on oracle values needs the oracle stage first (fill_oracle_values)")
        values = exp.oracle_values
        bootstrap = values.new_zeros(exp.n)  # V* after a response's last token: 0 (nothing more can be won)
    elif exp.values is None:
        raise ValueError("fill_advantages needs the values stage first (critic-based estimator)")
    else:
        values, bootstrap = exp.values, exp.bootstrap
    lengths = exp.mask.sum(1).clamp(min=1)
    if s.alpha is not None:
        lam_policy = algos.length_adaptive_lambda(lengths, s.alpha, s.gamma).to(exp.mask.device)
        clamped = algos.lambda_clamped(lengths, s.alpha, s.gamma)
    else:
        # the dtype length_adaptive_lambda gives, not the default one (bf16 under bf16-true: 0.95 -> 0.9492)
        lam_dtype = torch.float64 if lengths.dtype == torch.float64 else torch.float32
        lam_policy, clamped = torch.full((exp.n,), s.lam, dtype=lam_dtype, device=exp.mask.device), 0
    lam_critic = lam_policy if s.lam_critic is None else s.lam_critic
    obs_mask = getattr(exp, "obs_mask", None)  # (a stand-in with the stage's fields only is single-turn)
    if obs_mask is None:
        gae = algos.decoupled_gae
    else:  # multi-turn: the observation spans crossed as `s.observations` says

        def gae(r, v, m, la, lc, **kw):
            return algos.decoupled_gae_observations(
                r, v, m, obs_mask, la, lc, observations=s.observations, **kw
            )

    advantages, returns = gae(
        exp.rewards, values, exp.mask, lam_policy, lam_critic, gamma=s.gamma, bootstrap_values=bootstrap
    )
    if s.lam_critic == 1.0:
        exp.mc_returns = returns
    elif obs_mask is None:
        exp.mc_returns = algos.gae(
            exp.rewards, values, exp.mask, 1.0, gamma=s.gamma, bootstrap_values=bootstrap
        )[1]
    else:
        exp.mc_returns = gae(
            exp.rewards, values, exp.mask, 1.0, 1.0, gamma=s.gamma, bootstrap_values=bootstrap
        )[1]
    by_length = advantage_by_length(lam_policy, advantages, exp.mc_returns - values, exp.mask)
    if s.whiten:
        advantages = algos.masked_whiten(advantages, exp.mask)
    exp.lam_policy, exp.advantages, exp.returns = lam_policy, advantages, returns
    return AdvantageStats(
        float(lam_policy.mean()),
        float(lam_policy.min()),
        float(lam_policy.max()),
        clamped,
        advantage_by_turn=advantage_by_turn(exp),
        by_length=by_length,
    )


def advantage_by_length(lam_policy, advantages, mc_advantages, mask) -> dict:
    """The length diagnostics of `AdvantageStats.by_length` (advantages before whitening)."""
    lengths = mask.sum(1)
    per_row = algos.bucketize(lengths.long(), LENGTH_EDGES)
    has = lengths > 0
    bias, var, var_mc, counts = algos.advantage_error(advantages, mc_advantages, mask, LENGTH_EDGES)
    out = {}
    for i, label in enumerate(bucket_labels(LENGTH_EDGES)):
        rows = has & (per_row == i)
        if int(counts[i]):
            out[label] = {
                "lambda_policy": float(lam_policy[rows].double().mean()),
                "adv_bias": float(bias[i]),
                "adv_var": float(var[i]),
                "adv_var_mc": float(var_mc[i]),
            }
    return out


def loss_share_by_length(
    exp: Experience, idx: torch.Tensor, aggregation: str, denominator
) -> dict[str, float]:
    """The share of mini-batch `idx`'s policy-gradient weight, sum_t w_t |A_t| (w_t: the token's
    weight in the loss under `aggregation` with the mini-batch's `denominator`), carried by each
    response-length bucket (LENGTH_EDGES) that has a response anywhere in the batch."""
    mask = exp.mask[idx]
    group = algos.bucketize(mask.sum(1).long(), LENGTH_EDGES)
    share = algos.weight_share(
        algos.aggregation_weights(mask, aggregation, denominator),
        exp.advantages[idx],
        group,
        len(LENGTH_EDGES) + 1,
    )
    present = torch.bincount(
        algos.bucketize(exp.mask.sum(1).long(), LENGTH_EDGES), minlength=len(LENGTH_EDGES) + 1
    )
    return {
        lab: float(s) for lab, s, n in zip(bucket_labels(LENGTH_EDGES), share.tolist(), present.tolist()) if n
    }


TURN_LABELS = ("turn1", "turn2", "turn3", "turn4plus")
"""Turn buckets of the multi-turn credit diagnostics (the 4th and later turns share one)."""


def turn_index(exp: Experience) -> torch.Tensor:
    """(N, R) long: 0 for the first policy turn's tokens, +1 after each observation span."""
    obs = exp.obs_mask
    starts = obs.clone()
    starts[:, 1:] = obs[:, 1:] * (1 - obs[:, :-1])
    return starts.cumsum(1).long()


def advantage_by_turn(exp: Experience) -> dict | None:
    """Mean actor advantage of the action tokens of turn 1, 2, 3 and 4+ (None single-turn)."""
    if getattr(exp, "obs_mask", None) is None:
        return None
    turn = turn_index(exp).clamp(max=len(TURN_LABELS) - 1)
    out = {}
    for i, label in enumerate(TURN_LABELS):
        m = exp.mask * (turn == i)
        if float(m.sum()) > 0:
            out[label] = float(algos.masked_mean(exp.advantages, m))
    return out


# ----------------------------------------------------------------------------- diagnostics
@dataclass(frozen=True)
class RolloutStats:
    """Length and shape of the batch."""

    response_length: float
    response_length_min: float
    response_length_max: float
    response_length_p90: float
    truncated_frac: float
    prompts: int
    samples_per_prompt: int
    observation_tokens: float | None = None
    """Multi-turn: mean observation tokens per episode (response_length counts action tokens only)."""
    observation_spans: float | None = None
    """Multi-turn: mean observation spans (answered tool calls) per episode."""

    def log(self) -> dict[str, float]:
        extra = (
            {}
            if self.observation_tokens is None
            else {
                "rollout/observation_tokens": self.observation_tokens,
                "rollout/observation_spans": self.observation_spans,
            }
        )
        return {
            **extra,
            "rollout/response_length": self.response_length,
            "rollout/response_length_min": self.response_length_min,
            "rollout/response_length_max": self.response_length_max,
            "rollout/response_length_p90": self.response_length_p90,
            "rollout/truncated_frac": self.truncated_frac,
            "rollout/prompts": float(self.prompts),
            "rollout/samples_per_prompt": float(self.samples_per_prompt),
        }


def rollout_stats(exp: Experience) -> RolloutStats:
    lf = exp.mask.sum(1).float()
    return RolloutStats(
        response_length=float(lf.mean()),
        response_length_min=float(lf.min()),
        response_length_max=float(lf.max()),
        response_length_p90=float(torch.quantile(lf, 0.9)),
        truncated_frac=float(exp.truncated.float().mean()),
        prompts=exp.n // exp.group_size,
        samples_per_prompt=exp.group_size,
        observation_tokens=None if exp.obs_mask is None else float(exp.obs_mask.sum(1).mean()),
        observation_spans=None if exp.obs_mask is None else float(turn_index(exp)[:, -1].float().mean()),
    )


@dataclass(frozen=True)
class ValueStats:
    """The critic at sampling time against a reference return (see `value_stats`)."""

    explained_variance: float
    explained_variance_pos: float
    """Over the correct responses' tokens (and `_neg` over the wrong ones')."""
    explained_variance_neg: float
    mean: float
    return_mean: float
    bias: float
    """Mean of V - return over valid tokens (and at the first token, by position, by length)."""
    bias_first_token: float
    bias_by_position: dict[str, float]
    """Bucket label (POSITION_EDGES, `bucket_labels`) -> bias; buckets without a token left out."""
    bias_by_length: dict[str, float]
    """Likewise by response length (LENGTH_EDGES)."""
    explained_variance_target: float
    """Against the critic's own lambda_critic targets, whatever the reference."""
    bias_at_observations: dict | None = None
    """Multi-turn: bias at the last action token before an observation span ('before_obs') and at
    the first one after it ('after_obs'), where credit crosses the environment's text."""
    mse_by_position: dict[str, float] = field(default_factory=dict)
    """Mean squared error (V - return)^2 by response position bucket (and `mse_by_length` by length)."""
    mse_by_length: dict[str, float] = field(default_factory=dict)
    oracle: "OracleValueStats | None" = None
    """Against the task's true values, where the task has them (longchain); None elsewhere."""

    def log(self) -> dict[str, float]:
        out = {
            "value/explained_variance": self.explained_variance,
            "value/explained_variance_pos": self.explained_variance_pos,
            "value/explained_variance_neg": self.explained_variance_neg,
            "value/mean": self.mean,
            "value/return_mean": self.return_mean,
            "value/bias": self.bias,
            "value/bias_first_token": self.bias_first_token,
        }
        out.update({f"value/bias_pos_{lab}": b for lab, b in self.bias_by_position.items()})
        out.update({f"value/bias_len_{lab}": b for lab, b in self.bias_by_length.items()})
        out["value/explained_variance_target"] = self.explained_variance_target
        out.update({f"value/bias_{k}": b for k, b in (self.bias_at_observations or {}).items()})
        out.update({f"value/mse_pos_{lab}": b for lab, b in self.mse_by_position.items()})
        out.update({f"value/mse_len_{lab}": b for lab, b in self.mse_by_length.items()})
        if self.oracle is not None:
            out.update(self.oracle.log())
        return out


@dataclass(frozen=True)
class OracleValueStats:
    """The critic against the true state values V* (`fill_oracle_values`), and V* against the
    reference return: how far the critic is from the best possible one, and what that best reaches."""

    explained_variance: float
    """1 - Var(V* - V) / Var(V*): how much of the true values' variation the critic predicts."""
    ceiling: float
    """Explained variance of V* itself against the reference return: what a critic predicting V*
    exactly scores in `value/explained_variance` (outcomes are random given the state; on one batch a
    critic exceeds it only where its errors happen to track that batch's outcome noise)."""
    value_mean: float
    """Mean V* over valid tokens (the critic's `value/mean` should approach it)."""
    mse_by_position: dict[str, float]
    """(V - V*)^2 by response position bucket, and by response length bucket below."""
    mse_by_length: dict[str, float]
    error_rates: dict[str, float]
    """The per-kind error rates V* was computed from (measured on the batch)."""

    def log(self) -> dict[str, float]:
        out = {
            "value/explained_variance_oracle": self.explained_variance,
            "value/oracle_ceiling": self.ceiling,
            "value/oracle_mean": self.value_mean,
        }
        out.update({f"value/mse_oracle_pos_{lab}": b for lab, b in self.mse_by_position.items()})
        out.update({f"value/mse_oracle_len_{lab}": b for lab, b in self.mse_by_length.items()})
        out.update({f"oracle/error_rate_{k}": r for k, r in self.error_rates.items()})
        return out


def value_stats(exp: Experience, reference: str = "targets") -> ValueStats:
    """The critic at sampling time against `reference` returns ('targets': its own lambda_critic
    targets; 'mc': Monte-Carlo returns): explained variance overall / correct / wrong responses,
    mean value and return, bias overall, at the first token, by response position and by length."""
    values, mask = exp.values, exp.mask
    returns = exp.returns if reference == "targets" else exp.mc_returns
    pos = exp.positive[:, None].to(mask.dtype) * mask
    neg = (exp.scores == 0)[:, None].to(mask.dtype) * mask
    first = torch.zeros_like(mask)
    first[:, 0] = mask[:, 0]

    def by_bucket(edges, by, x=None):
        mean, counts = algos.mean_by(values - returns if x is None else x, mask, edges, by=by)
        return {lab: b for lab, b, c in zip(bucket_labels(edges), mean.tolist(), counts.tolist()) if c}

    squared = (values - returns) ** 2
    oracle = None
    if exp.oracle_values is not None:
        true = exp.oracle_values
        oracle = OracleValueStats(
            explained_variance=float(algos.explained_variance(values, true, mask)),
            ceiling=float(algos.explained_variance(true, returns, mask)),
            value_mean=float(algos.masked_mean(true, mask)),
            mse_by_position=by_bucket(POSITION_EDGES, "position", (values - true) ** 2),
            mse_by_length=by_bucket(LENGTH_EDGES, "length", (values - true) ** 2),
            error_rates=dict(exp.oracle_rates or {}),
        )

    return ValueStats(
        explained_variance=float(algos.explained_variance(values, returns, mask)),
        explained_variance_pos=float(algos.explained_variance(values, returns, pos)),
        explained_variance_neg=float(algos.explained_variance(values, returns, neg)),
        mean=float(algos.masked_mean(values, mask)),
        return_mean=float(algos.masked_mean(returns, mask)),
        bias=float(algos.masked_mean(values - returns, mask)),
        bias_first_token=float(algos.masked_mean(values - returns, first)),
        bias_by_position=by_bucket(POSITION_EDGES, "position"),
        bias_by_length=by_bucket(LENGTH_EDGES, "length"),
        explained_variance_target=float(algos.explained_variance(values, exp.returns, mask)),
        bias_at_observations=None if exp.obs_mask is None else _bias_at_observations(exp, returns),
        mse_by_position=by_bucket(POSITION_EDGES, "position", squared),
        mse_by_length=by_bucket(LENGTH_EDGES, "length", squared),
        oracle=oracle,
    )


def _bias_at_observations(exp: Experience, returns: torch.Tensor) -> dict:
    obs = exp.obs_mask
    nxt = torch.zeros_like(obs)
    nxt[:, :-1] = obs[:, 1:]
    prev = torch.zeros_like(obs)
    prev[:, 1:] = obs[:, :-1]
    out = {}
    for name, at in (("before_obs", exp.mask * nxt), ("after_obs", exp.mask * prev)):
        if float(at.sum()) > 0:
            out[name] = float(algos.masked_mean(exp.values - returns, at))
    return out


def bucket_labels(edges) -> list[str]:
    edges = list(edges)
    labels = [f"lt{edges[0]}"] if edges[0] > 1 else ["first"]
    labels += [f"{a}-{b - 1}" for a, b in zip(edges[:-1], edges[1:])]
    labels.append(f"ge{edges[-1]}")
    return labels
