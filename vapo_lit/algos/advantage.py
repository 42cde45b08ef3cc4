"""Generalized advantage estimation for sparse-reward token MDPs, with VAPO's two lambdas.

Conventions (docs/algorithm.md "Formulas"):
  * `rewards`, `values`, `mask` are (B, T). `mask` is 1 on the policy's own response tokens and 0
    elsewhere, including zeros *inside* a response (tool or environment observations): the
    recursion skips those positions as if they were cut out of the row, so a masked position's
    value or reward never leaks into a valid one. Rewards on masked positions must be 0.
  * delta_t = r_t + gamma * V(next valid state) - V(s_t). After the last valid token the next
    state's value is `bootstrap_values[b]` for a row cut by the length limit, 0 for a terminal row.
  * A_t = delta_t + gamma * lambda * A_(next valid t); returns = A + V on valid tokens.
    Both are exactly 0 on masked positions and carry no gradient.
  * `lam` is a float or a (B,) tensor (one lambda per sequence, as length-adaptive GAE needs).

Backends: a C sweep (one pass over memory, see `_native.py`) for CPU tensors, and a vectorised
pure-torch scan (compaction + chunked matmul) for everything else. Both are tested against a
float64 loop.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from numbers import Real

import torch

from vapo_lit.algos import _native

__all__ = [
    "length_adaptive_lambda",
    "lambda_clamped",
    "gae",
    "decoupled_gae",
    "decoupled_gae_observations",
    "OBSERVATION_MODES",
    "group_normalized_advantage",
]


# --------------------------------------------------------------------------- lambda schedule
def _check_alpha_gamma(alpha: float, gamma: float) -> None:
    if not isinstance(alpha, Real) or not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha must be a finite number > 0 (paper: 0.05); got {alpha!r}")
    if not isinstance(gamma, Real) or not (0 < gamma <= 1):
        raise ValueError(f"gamma must be in (0, 1] (paper: 1.0); got {gamma!r}")


def _as_lengths(lengths) -> torch.Tensor:
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be a 1-D tensor (B,); got shape {tuple(lengths.shape)}")
    if lengths.numel() and not bool((lengths > 0).all()):
        bad = lengths[lengths <= 0][0].item()
        raise ValueError(f"lengths must all be > 0 (number of valid response tokens); got {bad}")
    return lengths


def _raw_lambda(lengths: torch.Tensor, alpha: float, gamma: float) -> torch.Tensor:
    lam = 1.0 - 1.0 / (alpha * lengths.to(torch.float64))
    return lam / gamma if gamma != 1.0 else lam


def length_adaptive_lambda(lengths, alpha: float = 0.05, gamma: float = 1.0) -> torch.Tensor:
    """lambda_policy = 1 - 1/(alpha * l) per sequence (VAPO Eq. 5), clamped to [0, 1].

    Derived from keeping the effective GAE window `1/(1 - gamma*lambda)` equal to `alpha*l`; with
    gamma != 1 this project uses `(1 - 1/(alpha*l)) / gamma` (docs/algorithm.md). Returns a (B,) float32
    tensor (float64 when `lengths` is float64). l=20, alpha=0.05 -> 0; l=100 -> 0.8.
    """
    _check_alpha_gamma(alpha, gamma)
    lengths = _as_lengths(lengths)
    out_dtype = torch.float64 if lengths.dtype == torch.float64 else torch.float32
    return _raw_lambda(lengths, alpha, gamma).clamp(0.0, 1.0).to(out_dtype)


def lambda_clamped(lengths, alpha: float = 0.05, gamma: float = 1.0) -> int:
    """How many sequences had their length-adaptive lambda clamped (formula outside [0, 1])."""
    _check_alpha_gamma(alpha, gamma)
    raw = _raw_lambda(_as_lengths(lengths), alpha, gamma)
    return int(((raw < 0) | (raw > 1)).sum())


# --------------------------------------------------------------------------- validation
def _check_inputs(rewards, values, mask, bootstrap_values, gamma):
    for name, x in (("rewards", rewards), ("values", values), ("mask", mask)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor of shape (B, T); got {type(x).__name__}")
        if x.dim() != 2:
            raise ValueError(f"{name} must have shape (B, T); got shape {tuple(x.shape)}")
    if values.shape != rewards.shape or mask.shape != rewards.shape:
        raise ValueError(
            "rewards, values and mask must have the same (B, T) shape; got "
            f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)}, mask {tuple(mask.shape)}"
        )
    if not rewards.is_floating_point() or not values.is_floating_point():
        raise ValueError(f"rewards and values must be floating point; got {rewards.dtype} and {values.dtype}")
    if not isinstance(gamma, Real) or not (0 <= gamma <= 1):
        raise ValueError(f"gamma must be in [0, 1] (paper: 1.0); got {gamma!r}")
    B = rewards.shape[0]
    if bootstrap_values is not None:
        bootstrap_values = torch.as_tensor(bootstrap_values)
        if bootstrap_values.shape != (B,):
            raise ValueError(
                f"bootstrap_values must have shape (B,) = ({B},); got {tuple(bootstrap_values.shape)}"
            )


def _as_lambda(lam, name: str, B: int, like: torch.Tensor) -> torch.Tensor:
    if isinstance(lam, torch.Tensor) and lam.dim() > 0:
        if lam.shape != (B,):
            raise ValueError(
                f"{name} must be a float or a (B,) = ({B},) tensor; got shape {tuple(lam.shape)}"
            )
        t = lam.detach().to(device=like.device, dtype=like.dtype)
    else:
        val = float(lam)
        t = torch.full((B,), val, device=like.device, dtype=like.dtype)
    if t.numel() and not bool(((t >= 0) & (t <= 1)).all()):
        bad = t[(t < 0) | (t > 1) | t.isnan()][0].item()
        raise ValueError(f"{name} must be in [0, 1]; got {bad}")
    return t.contiguous()


# --------------------------------------------------------------------------- public API
def gae(rewards, values, mask, lam, gamma: float = 1.0, bootstrap_values=None):
    """(advantages, returns) with one lambda (float or per-sequence (B,) tensor). See module doc."""
    adv, ret = _sweep(rewards, values, mask, lam, None, gamma, bootstrap_values)
    return adv, ret


def decoupled_gae(
    rewards, values, mask, lam_policy, lam_critic=1.0, gamma: float = 1.0, bootstrap_values=None
):
    """VAPO's decoupled GAE from one pass over the TD residuals.

    Returns (advantages, returns): actor advantages A(lam_policy) and critic targets
    V + A(lam_critic), two separate detached tensors (never one advantage feeding both losses).
    """
    return _sweep(rewards, values, mask, lam_policy, lam_critic, gamma, bootstrap_values)


OBSERVATION_MODES = ("skip", "step", "zero")
"""How GAE crosses observation spans (docs/algorithm.md "Multi-turn trajectories"): skip (carry the next
value and the running advantage through unchanged), step (every token a timestep), zero (values
zeroed on observation tokens, which then take part in the recursion; biased when `gamma*lambda < 1`)."""


def decoupled_gae_observations(
    rewards,
    values,
    action_mask,
    obs_mask,
    lam_policy,
    lam_critic=1.0,
    gamma: float = 1.0,
    bootstrap_values=None,
    observations: str = "skip",
):
    """:func:`decoupled_gae` over a multi-turn trajectory: (advantages, returns), both 0 off the
    action tokens.

    `action_mask` (B, T) is 1 on the tokens the policy sampled, `obs_mask` (B, T) 1 on the tokens
    an environment wrote (disjoint from it); rewards sit on action tokens only. `values` must hold
    V(s_t) on observation tokens too for `step`. `bootstrap_values` (B,) is the value after the
    last token of the row (action or observation), as in :func:`gae`.

    * skip: the recursion runs over the action tokens only (observation positions are cut out:
      no residual, no decay); the value read after an observation span is the next action
      token's, whose state includes the observation.
    * step: every action or observation token is a timestep with its own value and residual.
    * zero: like step, with V = 0 on observation tokens.
    """
    if observations not in OBSERVATION_MODES:
        raise ValueError(
            f"observations={observations!r} is not valid; choose one of: {', '.join(OBSERVATION_MODES)}"
        )
    if (
        not isinstance(obs_mask, torch.Tensor)
        or not isinstance(action_mask, torch.Tensor)
        or obs_mask.shape != action_mask.shape
    ):
        raise ValueError(
            "action_mask and obs_mask must be tensors of the same (B, T) shape; got "
            f"{tuple(getattr(action_mask, 'shape', ()))} and {tuple(getattr(obs_mask, 'shape', ()))}"
        )
    if bool(((obs_mask != 0) & (obs_mask != 1)).any()):
        raise ValueError("obs_mask must contain only 0 and 1")
    if bool(((obs_mask != 0) & (action_mask != 0)).any()):
        b, t = ((obs_mask != 0) & (action_mask != 0)).nonzero()[0].tolist()
        raise ValueError(
            f"a token cannot be both an action and an observation: action_mask and obs_mask are both 1 at [{b}, {t}]"
        )
    if observations == "skip":
        return decoupled_gae(rewards, values, action_mask, lam_policy, lam_critic, gamma, bootstrap_values)
    steps = action_mask + obs_mask  # (B, T) every real token is a timestep
    v = values if observations == "step" else values * action_mask
    adv, ret = decoupled_gae(rewards, v, steps, lam_policy, lam_critic, gamma, bootstrap_values)
    return adv * action_mask, ret * action_mask


def _sweep(rewards, values, mask, lam_a, lam_c, gamma, bootstrap_values):
    _check_inputs(rewards, values, mask, bootstrap_values, gamma)
    B, T = rewards.shape
    dtype = torch.promote_types(rewards.dtype, values.dtype)
    if dtype not in (torch.float32, torch.float64):
        dtype = torch.float32
    r = rewards.detach().to(dtype).contiguous()
    v = values.detach().to(dtype).contiguous()
    m = mask.detach().to(dtype).contiguous()
    la = _as_lambda(lam_a, "lam_policy" if lam_c is not None else "lam", B, r)
    lc = _as_lambda(lam_c, "lam_critic", B, r) if lam_c is not None else None
    boot = None
    if bootstrap_values is not None:
        boot = torch.as_tensor(bootstrap_values).detach().to(device=r.device, dtype=dtype).contiguous()
    gamma = float(gamma)

    lib = _native.load() if (r.device.type == "cpu" and _native.backend_choice() != "torch") else None
    if lib is not None:
        adv, ret, bad = _sweep_native(lib, r, v, m, boot, la, lc, gamma)
        if bool((bad >= 0).any()):
            row = int((bad >= 0).nonzero()[0, 0])
            _raise_bad_mask(m[row], r[row], row)
    else:
        _check_mask(m, r)
        adv, ret = _sweep_torch(r, v, m, boot, la, lc, gamma)
    return adv, ret


def _raise_bad_mask(m_row, r_row, row):
    not01 = ((m_row != 0) & (m_row != 1)).nonzero()
    if len(not01):
        col = int(not01[0, 0])
        raise ValueError(f"mask must contain only 0 and 1; got {m_row[col].item()} at [{row}, {col}]")
    col = int(((m_row == 0) & (r_row != 0)).nonzero()[0, 0])
    raise ValueError(
        f"rewards must be 0 where mask is 0 (a reward on a masked position would be dropped); got "
        f"{r_row[col].item()} at [{row}, {col}]: put the outcome reward on the last valid token"
    )


def _check_mask(m, r):
    bad = (m != 0) & (m != 1) | ((m == 0) & (r != 0))
    if bool(bad.any()):
        row = int(bad.any(1).nonzero()[0, 0])
        _raise_bad_mask(m[row], r[row], row)


_POOL: ThreadPoolExecutor | None = None
_MIN_ROWS_PER_THREAD_ELEMS = 1 << 16  # below this many elements a second thread costs more than it saves


def _sweep_native(lib, r, v, m, boot, la, lc, gamma):
    """Run the C sweep, rows split over torch's intra-op thread count (ctypes drops the GIL)."""
    B, T = r.shape
    adv = torch.empty_like(r)
    ret = torch.empty_like(r)
    bad = torch.empty(B, dtype=torch.int64)
    fn = lib.vapo_gae_f32 if r.dtype == torch.float32 else lib.vapo_gae_f64
    size = r.element_size()

    def run(b0: int, b1: int) -> None:
        row = lambda t, width=T, s=size: None if t is None else t.data_ptr() + b0 * width * s  # noqa: E731
        fn(
            row(r),
            row(v),
            row(m),
            row(boot, 1),
            row(la, 1),
            row(lc, 1),
            row(adv),
            row(ret),
            bad.data_ptr() + b0 * 8,
            b1 - b0,
            T,
            gamma,
        )

    n_threads = max(1, min(torch.get_num_threads(), B, (B * T) // _MIN_ROWS_PER_THREAD_ELEMS))
    if n_threads == 1:
        run(0, B)
    else:
        global _POOL
        if _POOL is None or _POOL._max_workers < n_threads:
            _POOL = ThreadPoolExecutor(max_workers=n_threads, thread_name_prefix="vapo-gae")
        bounds = [B * i // n_threads for i in range(n_threads + 1)]
        for f in [_POOL.submit(run, bounds[i], bounds[i + 1]) for i in range(n_threads)]:
            f.result()
    return adv, ret, bad


# --------------------------------------------------------------------------- pure-torch scan
def _sweep_torch(r, v, m, boot, la, lc, gamma):
    """Compact each row's valid tokens to the front, scan, scatter back."""
    B, T = r.shape
    valid = m > 0
    n = valid.sum(1)  # (B,) valid tokens per row
    # Permutation that moves valid positions to the front, keeping order (no sort needed).
    csum = valid.cumsum(1)
    dest = torch.where(valid, csum - 1, n[:, None] + (~valid).cumsum(1) - 1)  # (B, T)
    rc = torch.zeros_like(r).scatter_(1, dest, r)
    vc = torch.zeros_like(v).scatter_(1, dest, v)
    pos = torch.arange(T, device=r.device)
    inside = pos[None, :] < n[:, None]  # (B, T) compact validity
    vc = vc * inside
    v_next = torch.cat([vc[:, 1:], vc.new_zeros(B, 1)], dim=1)
    if boot is not None:
        last = pos[None, :] == (n - 1)[:, None]
        v_next = torch.where(last, boot[:, None], v_next)
    delta = (rc + gamma * v_next - vc) * inside
    adv_c = _reverse_discounted_cumsum(delta, gamma * la)
    ret_c = _reverse_discounted_cumsum(delta, gamma * lc) if lc is not None else adv_c
    ret_c = (ret_c + vc) * inside
    adv = adv_c.gather(1, dest) * m
    ret = ret_c.gather(1, dest) * m
    return adv, ret


def _reverse_discounted_cumsum(x: torch.Tensor, c: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """y_t = sum_{k>=t} c^(k-t) x_k per row, c of shape (B,), in chunks: O(T * chunk) work.

    Within a chunk the discount matrix M[t, k] = c^(k-t) (k >= t) is shared by all chunks of a row,
    so the local sums are one batched matmul; chunk boundaries are joined by a short reverse loop.
    Exponents are integers, so c = 0 is exact (0^0 = 1) and nothing overflows (c <= 1).
    """
    B, T = x.shape
    L = max(1, min(chunk, T))
    C = -(-T // L)
    xs = torch.nn.functional.pad(x, (0, C * L - T)).view(B, C, L)
    j = torch.arange(L + 1, device=x.device, dtype=x.dtype)
    powers = c[:, None] ** j[None, :]  # (B, L+1): c^0 .. c^L
    t_idx = torch.arange(L, device=x.device)
    diff = t_idx[None, :] - t_idx[:, None]  # (L, L): k - t
    M = powers[:, diff.clamp(min=0)] * (diff >= 0)  # (B, L, L)
    local = torch.bmm(xs, M.transpose(1, 2))  # (B, C, L): sums inside each chunk
    # carry[c] = full y at the first position of chunk c+1; y = local + c^(L-t) * carry
    tail = powers[:, L - t_idx]  # (B, L): c^(L - t)
    out = torch.empty_like(local)
    carry = x.new_zeros(B)
    for ci in range(C - 1, -1, -1):
        out[:, ci] = local[:, ci] + tail * carry[:, None]
        carry = out[:, ci, 0]
    return out.reshape(B, C * L)[:, :T]


# --------------------------------------------------------------------------- critic-free baseline
def group_normalized_advantage(scores, mask, group_size: int, eps: float = 1e-6, scale: bool = True):
    """GRPO/DAPO outcome advantage: (score - group mean) / (group std + eps), on every valid token.

    `scores` (N,) with N = prompts x group_size, samples of one prompt adjacent; `mask` (N, T).
    The std is the unbiased (Bessel-corrected) std of the group, as verl, TRL and DAPO's code
    compute it. A group whose scores are all equal, whatever their value, gets exactly 0 (no
    signal; float rounding of the mean must not leave a small advantage of one sign). `scale=False`
    keeps only the mean baseline (Dr. GRPO).
    """
    scores = torch.as_tensor(scores, dtype=mask.dtype if mask.is_floating_point() else torch.float32)
    if scores.dim() != 1 or scores.shape[0] != mask.shape[0]:
        raise ValueError(f"scores must have shape (N,) = ({mask.shape[0]},); got {tuple(scores.shape)}")
    if group_size < 2 or scores.shape[0] % group_size:
        raise ValueError(f"group_size must be >= 2 and divide N = {scores.shape[0]}; got {group_size}")
    g = scores.view(-1, group_size)
    centred = g - g.mean(1, keepdim=True)
    if scale:
        centred = centred / (g.std(1, unbiased=True, keepdim=True) + eps)
    flat = g.max(1, keepdim=True).values == g.min(1, keepdim=True).values  # all equal: no signal
    centred = torch.where(flat, torch.zeros_like(centred), centred)
    return centred.reshape(-1, 1) * mask
