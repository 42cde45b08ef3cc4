"""The built-in tiny base policy (SFT on imperfect chain demonstrations) and reward model.

Both are built on first use (a few minutes at most on 2 CPU cores) and cached on disk under a key
of their full build config + seed + :data:`CODE_VERSION` (see :mod:`vapo_lit.cache`).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from vapo_lit.models.quiet import quiet_transformers
from vapo_lit.rng import BuildSeed, sample_seed
from vapo_lit.tasks.chain import ChainTask, DemoConfig
from vapo_lit.tasks.env import is_environment

CODE_VERSION = "builtin-v2"  # v2: per-sample counter-based sampling streams (vapo_lit.rng)
"""Bump when the build code changes in a way that changes the artefacts."""


@dataclass(frozen=True)
class TinyModelConfig:
    """Architecture of the tiny Llama used for the built-in policy and reward model."""

    hidden_size: int = 64
    """Model width."""
    num_hidden_layers: int = 2
    """Transformer blocks."""
    num_attention_heads: int = 4
    """Attention heads (also key/value heads)."""
    intermediate_size: int = 256
    """MLP width."""
    max_position_embeddings: int = 512
    """Longest prompt + response the RoPE config is declared for."""
    rope_theta: float = 10000.0
    """RoPE base."""
    factored_counter_init: bool = True
    """Initialise the embedding of counter "k:" as units[k % 10] + tens[k // 10] (a prior that
    makes k mod 10 readable from the start; without it SFT plateaus on the digit rule)."""


@dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning of the base policy on imperfect demonstrations."""

    steps: int = 300
    """Optimizer steps."""
    batch_size: int = 32
    """Demonstrations per step (fresh samples every step)."""
    lr: float = 5e-3
    """Peak AdamW learning rate (linear warmup, cosine decay to 10%)."""
    warmup_steps: int = 30
    """Linear warmup steps."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient-norm clip."""
    demo: DemoConfig = field(default_factory=DemoConfig)
    """The demonstrator (where and how often it errs)."""
    micro_batches: int = 0
    """0: each batch in one pass with its attention mask (the built-in default's build, unchanged).
    k > 0: the batch sorted by length and cut into k micro-batches, each padded to its own longest
    row and run causally without a mask (a right-padded row's padding comes after every real token),
    gradients accumulated over the batch's tokens: the same loss, and at thousands of tokens a
    fraction of the cost (no (L, L) mask, far less padding; the long preset)."""


@dataclass(frozen=True)
class RewardModelConfig:
    """The outcome reward model: trained on base-policy samples scored by the verifier."""

    samples: int = 1024
    """Base-policy responses sampled (temperature 1, top-p 1) to train on."""
    steps: int = 300
    """Optimizer steps (batches drawn from the samples)."""
    batch_size: int = 32
    """Responses per step."""
    lr: float = 2e-3
    """Peak AdamW learning rate (linear warmup, cosine decay to 10%)."""
    warmup_steps: int = 20
    """Linear warmup steps."""
    all_tokens: bool = False
    """False: regress the score at the last response token only (an outcome RM, the paper's
    vanilla-PPO critic init). True: every response token regresses the final 0/1 (Monte-Carlo
    value pretraining with lambda = 1)."""
    balance: bool = True
    """Weight positives and negatives equally in the loss (positives are rare)."""
    micro_batches: int = 0
    """As SFTConfig.micro_batches: 0 one masked pass per batch; k > 0 length-sorted micro-batches,
    each row moved left by its prompt padding and run causally without a mask (the long preset)."""


def default_model(task) -> TinyModelConfig:
    """The architecture of a task's built-in models: TinyModelConfig's defaults, with positions
    declared for the task's longest prompt and response when 512 is too few (the long preset)."""
    cfg = TinyModelConfig()
    need = MAX_PROMPT_TOKENS + task.max_new_tokens
    if need > cfg.max_position_embeddings:
        cfg = replace(cfg, max_position_embeddings=512 * math.ceil(need / 512))
    return cfg


def vllm_model(task) -> TinyModelConfig:
    """The built-in architecture for rollout_engine=vllm: `default_model`'s, its width in one attention
    head of 64 (vLLM's CPU backend runs head sizes 32 to 512 and refuses the default's 4 heads of 16).
    The parameter count is the default's; the models are built and cached apart from the default ones."""
    return replace(default_model(task), num_attention_heads=1)


MAX_PROMPT_TOKENS = 16
"""Room for the built-in tasks' prompts (at most 9 tokens) in `default_model`'s positions."""


def default_sft(task) -> SFTConfig:
    """The SFT of a task's built-in base policy: SFTConfig's defaults with the task's `sft_overrides`."""
    return SFTConfig(**getattr(task, "sft_overrides", {}))


def threads() -> int:
    return min(2, torch.get_num_threads())


def llama_config(task: ChainTask, cfg: TinyModelConfig):
    from transformers import LlamaConfig

    tok = task.tokenizer
    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )


def _lr_lambda(warmup: int, total: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        frac = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    return f


@torch.no_grad()
def init_counter_embeddings(model, task: ChainTask) -> None:
    """emb("k:") = units[k % 10] + tens[k // 10], each part drawn like the model's own init."""
    emb = model.get_input_embeddings().weight
    std = model.config.initializer_range
    vocab = task.tokenizer.get_vocab()
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, (1,))))
    units = torch.randn(10, emb.shape[1], generator=gen) * std
    tens = torch.randn(task.config.max_n // 10 + 1, emb.shape[1], generator=gen) * std
    for k in range(1, task.config.max_n + 1):
        emb[vocab[f"{k}:"]] = units[k % 10] + tens[k // 10]


def batch_from_texts(tokenizer, prompts: list[str], responses: list[str]):
    """Right-padded (ids, attention_mask, loss_mask) of prompt + response + EOS; loss_mask is 1 on
    the response tokens (EOS included) at the positions of the *targets*."""
    vocab = tokenizer.get_vocab()
    rows, targets = [], []
    for p, r in zip(prompts, responses):
        pids = tokenizer(p)["input_ids"]
        rids = [vocab[w] for w in r.split()] + [tokenizer.eos_token_id]
        rows.append(pids + rids)
        targets.append([0.0] * len(pids) + [1.0] * len(rids))
    return _right_padded(tokenizer, rows, targets)


def batch_from_spans(tokenizer, prompts: list[str], episodes: list[list[tuple[str, bool]]]):
    """Like :func:`batch_from_texts` for multi-turn demonstrations, given as (text, is_action)
    spans: the loss mask is 1 on the action spans' tokens and the final EOS only (an observation
    the environment wrote is context, never a target)."""
    vocab = tokenizer.get_vocab()
    rows, targets = [], []
    for p, spans in zip(prompts, episodes):
        ids = tokenizer(p)["input_ids"]
        tgt = [0.0] * len(ids)
        for text, is_action in spans:
            words = [vocab[w] for w in text.split()]
            ids += words
            tgt += [float(is_action)] * len(words)
        rows.append(ids + [tokenizer.eos_token_id])
        targets.append(tgt + [1.0])
    return _right_padded(tokenizer, rows, targets)


def _right_padded(tokenizer, rows: list[list[int]], targets: list[list[float]]):
    """(ids, attention_mask, loss_mask) of token rows right-padded to the longest; `targets`: each
    row's per-token loss weight."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask = torch.zeros((len(rows), width), dtype=torch.float)
    for i, (row, tgt) in enumerate(zip(rows, targets)):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
        loss_mask[i, : len(row)] = torch.tensor(tgt)
    return ids, mask, loss_mask


def train_sft(task: ChainTask, model_cfg: TinyModelConfig, sft: SFTConfig, seed: int, *, log=None):
    """SFT a fresh tiny Llama on imperfect demonstrations; returns the model (eval mode)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(task, model_cfg))
    tok = task.tokenizer
    if model_cfg.factored_counter_init:
        init_counter_embeddings(model, task)
    opt = torch.optim.AdamW(model.parameters(), lr=sft.lr, weight_decay=sft.weight_decay, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(sft.warmup_steps, sft.steps))
    rng = random.Random(f"vapo-lit/sft/{seed}")
    model.train()
    t0 = time.time()
    for step in range(sft.steps):
        probs = task.train_problems(sft.batch_size, seed=rng.getrandbits(62))
        if is_environment(task):  # the task's own demonstrator (its config is in the cache key)
            demos = [task.demonstration_spans(p, rng) for p in probs]
            ids, mask, loss_mask = batch_from_spans(tok, [p.prompt for p in probs], demos)
        else:
            demos = [task.demonstration(p, sft.demo, rng) for p in probs]
            ids, mask, loss_mask = batch_from_texts(tok, [p.prompt for p in probs], demos)
        opt.zero_grad(set_to_none=True)
        if sft.micro_batches == 0:
            loss = lm_loss(model, ids, mask, loss_mask, loss_mask[:, 1:].sum())
            loss.backward()
        else:
            loss, tokens = 0.0, loss_mask[:, 1:].sum()
            order = torch.sort(mask.sum(1), descending=True, stable=True).indices
            for rows in order.chunk(sft.micro_batches):
                width = int(mask[rows].sum(1).max())
                part = lm_loss(model, ids[rows, :width], None, loss_mask[rows, :width], tokens)
                part.backward()
                loss += part.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), sft.grad_clip)
        opt.step()
        sched.step()
        if log is not None and (step % 50 == 0 or step == sft.steps - 1):
            log(f"sft step {step} loss {loss.item():.4f} ({time.time() - t0:.1f}s)")
    model.eval()
    return model


def lm_loss(model, ids, mask, loss_mask, tokens) -> torch.Tensor:
    """Sum of the next-token NLL over the loss mask's targets, divided by `tokens`; `mask` None: a
    causal pass without an attention mask (rows right-padded, starting at column 0)."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    tgt, lm = ids[:, 1:], loss_mask[:, 1:]
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none"
    ).view_as(lm)
    return (nll * lm).sum() / tokens


def sample_scored(
    model,
    task: ChainTask,
    n: int,
    seed: int,
    *,
    batch_size: int = 256,
    temperature: float = 1.0,
    top_p: float = 1.0,
):
    """`n` base-policy rollouts on train prompts with their verifier rewards (list of (Rollout, rewards))."""
    from vapo_lit.engines import SamplingParams, make_engine

    engine = make_engine("hf", model, task.tokenizer, task=task)  # the episode loop for a multi-turn task
    sampling = SamplingParams(max_new_tokens=task.max_new_tokens, temperature=temperature, top_p=top_p)
    probs = task.train_problems(n, seed=seed)
    out = []
    for i in range(0, n, batch_size):
        chunk = probs[i : i + batch_size]
        ro = engine.generate(
            [p.prompt for p in chunk], sampling, [sample_seed(seed, j) for j in range(i, i + len(chunk))]
        )
        rewards = torch.tensor([task.verify(p, t).reward for p, t in zip(chunk, ro.texts)])
        out.append((ro, rewards))
    return out


def value_batches(scored, batch_size: int, rng: random.Random):
    """Endless random minibatches (ids, mask, response_mask_for_values, reward) from scored rollouts.

    The value of the state before response token j is read at column P + j - 1, so the value
    mask is the response mask shifted left by one column (it covers the last prompt token and all
    response tokens but the final one: the state after EOS is terminal)."""
    items = []
    for ro, rewards in scored:
        ids, mask = ro.input_ids, ro.attention_mask
        p = ro.prompt_ids.shape[1]
        vmask = torch.zeros(ids.shape, dtype=torch.float)
        vmask[:, p - 1 : p - 1 + ro.response_mask.shape[1]] = ro.response_mask
        for i in range(ids.shape[0]):
            items.append((ids[i], mask[i], vmask[i], float(rewards[i]), int(ro.lengths[i])))
    while True:
        batch = rng.sample(items, min(batch_size, len(items)))
        yield collate_value_items(batch)


def collate_value_items(batch):
    """Stack value items of different widths (columns past a row's end are padding, mask 0)."""
    width = max(int(b[1].nonzero().max()) + 1 for b in batch)

    def stack(i, dtype):
        out = torch.zeros((len(batch), width), dtype=dtype)
        for r, b in enumerate(batch):
            w = min(width, b[i].shape[0])
            out[r, :w] = b[i][:w]
        return out

    ids, mask, vmask = stack(0, torch.long), stack(1, torch.long), stack(2, torch.float)
    reward = torch.tensor([b[3] for b in batch])
    last = torch.tensor([int(b[1].nonzero().max()) for b in batch])  # column of the last real token
    return ids, mask, vmask, reward, last


# ----------------------------------------------------------------------------- value training
def value_loss(
    values: torch.Tensor,
    vmask: torch.Tensor,
    reward: torch.Tensor,
    last: torch.Tensor,
    *,
    all_tokens: bool,
    balance: bool,
) -> torch.Tensor:
    """MSE of V against the final 0/1 reward: on every value state (``all_tokens``; Monte-Carlo
    returns with gamma = lambda = 1) or only at the last real token (an outcome reward model)."""
    w = sample_weights(reward, balance)
    return (sequence_errors(values, vmask, reward, last, all_tokens=all_tokens) * w).sum() / w.sum()


def sequence_errors(values, vmask, reward, last, *, all_tokens: bool) -> torch.Tensor:
    """(n,) each response's squared error of `value_loss` (mean over its value states, or at its last token)."""
    if all_tokens:
        err = (values - reward[:, None]) ** 2 * vmask
        return err.sum(1) / vmask.sum(1).clamp(min=1.0)
    return (values.gather(1, last[:, None]).squeeze(1) - reward) ** 2


def sample_weights(reward: torch.Tensor, balance: bool) -> torch.Tensor:
    """Per-response weight of `value_loss`: positives and negatives weighted equally (`balance`), or 1."""
    if balance:
        pos = reward.sum().clamp(min=1.0)
        neg = (1 - reward).sum().clamp(min=1.0)
        return torch.where(reward > 0.5, 0.5 / pos, 0.5 / neg) * len(reward)
    return torch.ones_like(reward)


def value_loss_micro(
    model, ids, mask, vmask, reward, last, micro_batches: int, *, all_tokens: bool, balance: bool
) -> torch.Tensor:
    """`value_loss` of the batch, its backward pass run over `micro_batches` length-sorted
    micro-batches, each causal and without a mask (rows moved left by their left padding, which
    goes after their last token); returns the loss (detached)."""
    w = sample_weights(reward, balance)
    shift = (mask.cumsum(1) == 0).sum(1)  # left padding per row
    cols = torch.arange(ids.shape[1])
    moved = (cols[None, :] + shift[:, None]) % ids.shape[1]
    ids, vmask, last = ids.gather(1, moved), vmask.gather(1, moved), last - shift
    total = 0.0
    for rows in torch.sort(last, descending=True, stable=True).indices.chunk(micro_batches):
        width = int(last[rows].max()) + 1
        errors = sequence_errors(
            model(ids[rows, :width], None),
            vmask[rows, :width],
            reward[rows],
            last[rows],
            all_tokens=all_tokens,
        )
        part = (errors * w[rows]).sum() / w.sum()
        part.backward()
        total += float(part)
    return torch.tensor(total, dtype=torch.float64)


def train_value(
    model,
    scored,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    warmup_steps: int,
    all_tokens: bool,
    balance: bool,
    seed: int,
    log=None,
    micro_batches: int = 0,
):
    """Fit a :class:`~vapo_lit.models.value.ValueModel` to scored rollouts (see :func:`value_loss`);
    `micro_batches` as RewardModelConfig.micro_batches."""
    rng = random.Random(f"vapo-lit/value/{seed}")
    batches = value_batches(scored, batch_size, rng)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(warmup_steps, steps))
    model.train()
    t0 = time.time()
    for step in range(steps):
        ids, mask, vmask, reward, last = next(batches)
        opt.zero_grad(set_to_none=True)
        if micro_batches == 0:
            loss = value_loss(model(ids, mask), vmask, reward, last, all_tokens=all_tokens, balance=balance)
            loss.backward()
        else:
            loss = value_loss_micro(
                model, ids, mask, vmask, reward, last, micro_batches, all_tokens=all_tokens, balance=balance
            )
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if log is not None and (step % 50 == 0 or step == steps - 1):
            log(f"value step {step} loss {loss.item():.4f} ({time.time() - t0:.1f}s)")
    model.eval()
    return model


@torch.no_grad()
def explained_variance(model, scored, *, batch_size: int = 64) -> dict[str, float]:
    """Token-level EV = 1 - Var(R - V) / Var(R) over every value state of the response (the
    state before each response token), R = the final 0/1 reward (gamma = 1); also the AUC-free
    outcome accuracy of V at the state before the last token (threshold 0.5)."""
    vs, rs, last_v, last_r = [], [], [], []
    model.eval()
    for ro, rewards in scored:
        for i in range(0, ro.prompt_ids.shape[0], batch_size):
            sub = [
                (ro.input_ids[j], ro.attention_mask[j], None, float(rewards[j]), 0)
                for j in range(i, min(i + batch_size, ro.prompt_ids.shape[0]))
            ]
            p = ro.prompt_ids.shape[1]
            ids = torch.stack([s[0] for s in sub])
            mask = torch.stack([s[1] for s in sub])
            rmask = ro.response_mask[i : i + len(sub)]
            vmask = torch.zeros(ids.shape)
            vmask[:, p - 1 : p - 1 + rmask.shape[1]] = rmask
            v = model(ids, mask)
            r = torch.tensor([s[3] for s in sub])
            sel = vmask > 0
            vs.append(v[sel])
            rs.append(r[:, None].expand_as(v)[sel])
            lastcol = (vmask * torch.arange(vmask.shape[1])).argmax(1)
            last_v.append(v.gather(1, lastcol[:, None]).squeeze(1))
            last_r.append(r)
    v, r = torch.cat(vs), torch.cat(rs)
    lv, lr_ = torch.cat(last_v), torch.cat(last_r)
    var_r = r.var(unbiased=False)
    ev = float(1 - (r - v).var(unbiased=False) / var_r) if var_r > 0 else float("nan")
    return {
        "ev": ev,
        "final_acc": float(((lv > 0.5).float() == lr_).float().mean()),
        "reward_mean": float(lr_.mean()),
        "tokens": float(len(r)),
    }


# ----------------------------------------------------------------------------- build + cache
def _cfg_dict(obj) -> dict:
    return asdict(obj)


def policy_build_config(task: ChainTask, model_cfg: TinyModelConfig, sft: SFTConfig, seed: int) -> dict:
    return {
        "code_version": CODE_VERSION,
        "task": _cfg_dict(task.config),
        "task_version": task.version,
        "model": _cfg_dict(model_cfg),
        "sft": _cfg_dict(sft),
        "seed": seed,
    }


def reward_build_config(policy_config: dict, rm: RewardModelConfig, seed: int) -> dict:
    return {
        "code_version": CODE_VERSION,
        "policy": policy_config,
        "reward_model": _cfg_dict(rm),
        "seed": seed,
    }


class _Threads:
    """Use at most 2 intra-op threads while building."""

    def __enter__(self):
        self.old = torch.get_num_threads()
        torch.set_num_threads(min(2, self.old))

    def __exit__(self, *exc):
        torch.set_num_threads(self.old)


@quiet_transformers()
def _load_policy_dir(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model.eval()
    return model, tok


@quiet_transformers()
def builtin_policy_dir(
    task: ChainTask,
    *,
    seed: int = 0,
    cache_dir=None,
    model_config: TinyModelConfig | None = None,
    sft_config: SFTConfig | None = None,
    log=None,
) -> Path:
    """Directory of the cached built-in base policy (built on first use)."""
    from vapo_lit.cache import cached_build

    model_cfg = model_config or default_model(task)
    sft = sft_config or default_sft(task)
    config = policy_build_config(task, model_cfg, sft, seed)

    def build(tmp: Path) -> None:
        with _Threads():
            model = train_sft(task, model_cfg, sft, seed, log=log)
        model.save_pretrained(tmp, safe_serialization=True)
        task.tokenizer.save_pretrained(tmp)

    return cached_build("policy", config, build, cache_dir=cache_dir, load=_load_policy_dir)


@quiet_transformers()
def builtin_reward_model_dir(
    task: ChainTask,
    *,
    seed: int = 0,
    cache_dir=None,
    model_config: TinyModelConfig | None = None,
    sft_config: SFTConfig | None = None,
    rm_config: RewardModelConfig | None = None,
    log=None,
) -> Path:
    """Directory of the cached outcome reward model (a saved ValueModel), built on first use from
    samples of the built-in base policy (built first if needed) scored by the task's verifier."""
    from vapo_lit.cache import cached_build
    from vapo_lit.models.value import ValueModel

    model_cfg = model_config or default_model(task)
    sft = sft_config or default_sft(task)
    rm = rm_config or RewardModelConfig(**getattr(task, "rm_overrides", {}))
    pdir = builtin_policy_dir(
        task, seed=seed, cache_dir=cache_dir, model_config=model_cfg, sft_config=sft, log=log
    )
    config = reward_build_config(policy_build_config(task, model_cfg, sft, seed), rm, seed)

    def build(tmp: Path) -> None:
        policy, _ = _load_policy_dir(pdir)
        with _Threads():
            scored = sample_scored(policy, task, rm.samples, seed=seed + BuildSeed.REWARD_MODEL_SAMPLES)
            if log is not None:
                rew = torch.cat([r for _, r in scored])
                log(f"reward model data: {len(rew)} samples, mean reward {rew.mean():.3f}")
            with torch.random.fork_rng():
                torch.manual_seed(seed + BuildSeed.REWARD_MODEL_HEAD)
                critic = ValueModel.from_causal_lm(policy)
            train_value(
                critic,
                scored,
                steps=rm.steps,
                batch_size=rm.batch_size,
                lr=rm.lr,
                warmup_steps=rm.warmup_steps,
                all_tokens=rm.all_tokens,
                balance=rm.balance,
                seed=seed,
                log=log,
                micro_batches=rm.micro_batches,
            )
        critic.save_pretrained(tmp)
        task.tokenizer.save_pretrained(tmp)

    return cached_build(
        "reward_model", config, build, cache_dir=cache_dir, load=lambda p: ValueModel.from_pretrained(p)
    )
