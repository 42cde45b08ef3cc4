"""Typed configuration: the vanilla-PPO base, VAPO's component values, presets.

Every field has a one-line doc (shown by `vapo-train --help`) and, where it has one, a valid
range that `validate()` enforces before any compute. Experiment files hold only deltas.

The seven VAPO switches live in `Switches`: what the component callbacks (`vapo_lit/components/`)
record of themselves; what each changes, it says through its hooks. A `Switches()` with nothing set
is vanilla PPO as docs/algorithm.md defines it.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any

COMPONENTS = (
    "value_pretraining",
    "decoupled_gae",
    "length_adaptive_gae",
    "token_level_loss",
    "clip_higher",
    "positive_lm_loss",
    "group_sampling",
)
"""The seven VAPO components, in the order of the paper's Table 1 discussion (docs/algorithm.md): the default recipe."""

OPTIONAL_COMPONENTS = (
    "kl_penalty",
    "dynamic_sampling",
)
"""Components outside VAPO's recipe: off unless named (`--only ...,kl_penalty`, a grid row's `only`).
This tuple is the registry of extensions: adding a component is a file
`vapo_lit/components/<name>.py`, its name here, and its values in `ComponentValues` (docs/guides/extending.md)."""

ALL_COMPONENTS = COMPONENTS + OPTIONAL_COMPONENTS

ROLLOUT_ENGINES = ("hf", "cb", "vllm")
"""The rollout engines' names (vapo_lit.engines.ENGINES maps each to its class)."""


def check_components(names, where: str = "") -> list[str]:
    """`names` as a list, or ValueError naming the unknown ones and listing the valid names.
    The one place component names are validated (config, CLI flags, grid files, callbacks)."""
    names = list(names)
    unknown = [n for n in names if n not in ALL_COMPONENTS]
    if unknown:
        prefix = f"{where}: " if where else ""
        raise ValueError(
            f"{prefix}unknown component(s) {', '.join(map(repr, unknown))}; valid names: {', '.join(ALL_COMPONENTS)}"
        )
    return names


def ordered(names) -> list[str]:
    """The named components in registry order (the seven first, then the optional ones)."""
    return [c for c in ALL_COMPONENTS if c in names]


def _f(default, doc: str, lo=None, hi=None, choices=None, lo_open=False, hi_open=False):
    """A dataclass field with its doc and valid range (inclusive unless *_open)."""
    meta = {"doc": doc, "lo": lo, "hi": hi, "choices": choices, "lo_open": lo_open, "hi_open": hi_open}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ComponentValues:
    """The values the component callbacks apply when switched on (paper values by default)."""

    value_pretrain_steps: int = _f(50, "max critic-only iterations of value pretraining (paper: 50)", lo=1)
    value_pretrain_min_ev: float | None = _f(
        None, "stop value pretraining early once critic explained variance reaches this", lo=-1.0, hi=1.0
    )
    value_pretrain_ev_window: int = _f(
        1,
        "value_pretrain_min_ev is checked against the median explained variance of this many "
        "last iterations (one batch's is noisy)",
        lo=1,
    )
    value_pretrain_critic_lr: float | None = _f(
        None,
        "the critic's learning rate during value pretraining (None: ppo.critic_lr, which PPO uses after it)",
        lo=0.0,
        lo_open=True,
    )
    value_pretrain_critic_epochs: int | None = _f(
        None,
        "the critic's passes over each batch during value pretraining "
        "(None: ppo.critic_epochs, which PPO uses after it)",
        lo=1,
    )
    lambda_critic: float = _f(
        1.0, "lambda of the critic targets with decoupled GAE (paper: 1.0)", lo=0.0, hi=1.0
    )
    alpha: float = _f(
        0.05,
        "length-adaptive GAE alpha: lambda = 1 - 1/(alpha*l) (paper: 0.05, for chains of thousands of tokens)",
        lo=0.0,
        lo_open=True,
    )
    eps_high: float = _f(0.28, "upper clip epsilon with Clip-Higher (DAPO/VAPO: 0.28)", lo=0.0)
    mu: float = _f(0.1, "weight of the positive-example NLL (paper: 0.1)", lo=0.0)
    samples_per_prompt: int = _f(16, "samples per prompt with group sampling (paper: 16)", lo=2)
    kl_coef: float = _f(
        0.05,
        "weight of the KL(policy || initial policy) penalty of the optional kl_penalty component (not in VAPO)",
        lo=0.0,
    )
    dynamic_max_rounds: int = _f(
        10,
        "dynamic_sampling (DAPO, not in VAPO): at most this many prompt batches sampled per "
        "iteration, the step's own included (DAPO's max_num_gen_batches, 10 in its recipe); "
        "when they hold too few mixed groups the batch is filled with uniform ones, logged",
        lo=1,
    )


@dataclass
class Switches(ComponentValues):
    """Which components are on, with their values: the record of a run (run card, checkpoint). All
    booleans False: vanilla PPO (docs/algorithm.md table, column 'off').

    Set only by the component callbacks, each of which declares the fields it may change. The module
    never reads them: a component changes the run through its hooks (components/base.py).
    """

    value_pretraining: bool = _f(
        False, "train the critic alone on the initial policy's samples before any actor update"
    )
    decoupled_gae: bool = _f(False, "critic targets use lambda_critic, actor advantages lambda_policy")
    length_adaptive_gae: bool = _f(False, "lambda_policy = 1 - 1/(alpha * l) per response (else ppo.lam)")
    token_level_loss: bool = _f(
        False,
        "policy loss averaged over all tokens of the mini-batch (else per response, then over responses)",
    )
    clip_higher: bool = _f(False, "asymmetric clip range [1 - eps, 1 + eps_high] (else eps on both sides)")
    positive_lm_loss: bool = _f(False, "add mu * NLL of the correct responses to the policy loss")
    group_sampling: bool = _f(
        False, "fewer prompts, samples_per_prompt samples each, same responses per step"
    )
    dynamic_sampling: bool = _f(
        False,
        "drop groups whose responses all score the same and sample more prompts until "
        "the batch is full (DAPO; optional component, not in VAPO)",
    )


@dataclass
class PPOConfig:
    """Vanilla PPO settings (paper section 5.1 where it gives one; CPU-sized defaults otherwise)."""

    actor_lr: float = _f(1e-6, "actor AdamW learning rate (paper: 1e-6)", lo=0.0, lo_open=True)
    critic_lr: float = _f(
        2e-6, "critic AdamW learning rate (paper: 2e-6; the critic must keep pace)", lo=0.0, lo_open=True
    )
    weight_decay: float = _f(0.0, "AdamW weight decay of both optimizers", lo=0.0)
    warmup_steps: int = _f(
        0, "linear warmup of both learning rates over this many optimizer steps, then constant", lo=0
    )
    critic_warmup_steps: int | None = _f(
        None,
        "the critic's own linear warmup in optimizer steps (None: warmup_steps); "
        "restarts when PPO starts after value pretraining",
        lo=0,
    )
    lam: float = _f(0.95, "GAE lambda without length-adaptive GAE (paper vanilla: 0.95)", lo=0.0, hi=1.0)
    gamma: float = _f(1.0, "discount (paper: 1.0)", lo=0.0, hi=1.0, lo_open=True)
    eps: float = _f(
        0.2,
        "clip epsilon (both sides without Clip-Higher; the low side with it)",
        lo=0.0,
        hi=1.0,
        hi_open=True,
    )
    responses_per_step: int = _f(64, "responses sampled per PPO iteration (paper: 8192)", lo=1)
    mini_batch_size: int = _f(32, "responses per optimizer step (paper: 512)", lo=1)
    micro_batch_size: int = _f(
        32, "responses per forward/backward (gradient accumulation inside a mini-batch)", lo=1
    )
    critic_mini_batch_size: int | None = _f(
        None,
        "responses per critic optimizer step (None: mini_batch_size); "
        "with critic_epochs, how many critic steps an iteration takes",
        lo=1,
    )
    ppo_epochs: int = _f(1, "passes of the actor over each rollout batch", lo=1)
    critic_epochs: int = _f(1, "passes of the critic over each rollout batch", lo=1)
    critic_replay: int = _f(
        1,
        "batches the critic trains on in each PPO iteration: this one and the critic_replay - 1 "
        "before it, with their targets from when they were sampled, each mini-batch taking "
        "critic_mini_batch_size responses of every batch (as many steps, over more responses; "
        "1: this batch only; value pretraining always trains on its own batch)",
        lo=1,
    )
    whiten_advantages: bool = _f(
        True, "normalise actor advantages over the batch's valid tokens (critic targets never)"
    )
    value_clip: float | None = _f(
        None, "PPO value clipping range around rollout-time values (None: off)", lo=0.0, lo_open=True
    )
    grad_clip: float = _f(1.0, "max gradient norm, each model (0: off)", lo=0.0)
    max_new_tokens: int | None = _f(None, "response length limit (None: the task's default)", lo=1)
    temperature: float = _f(1.0, "rollout sampling temperature", lo=0.0, lo_open=True)
    rollout_batch_size: int | str | None = _f(
        "auto",
        "responses per generate call, rollouts and evals (None: all at once; "
        "auto: from the model's K/V size and the device's free memory, "
        "all at once when they fit); bounds sampling memory",
        lo=1,
    )
    logits_chunk: int | str | None = _f(
        "auto",
        "response positions per output-layer chunk in the update's log-prob pass "
        "(None: all; auto: from the vocabulary and the device's free memory, all "
        "when they fit); bounds logits memory to micro_batch x chunk x vocab",
        lo=1,
    )
    recompute_logprobs: bool | None = _f(
        None,
        "recompute the behaviour log-probs with the training forward pass (one extra "
        "actor pass) instead of taking the sampler's; None (auto): on under any "
        "precision below 32 bits (bf16-mixed, bf16 weights), where the sampler's "
        "rounding differs from the update's; also for a remote engine",
    )
    top_p: float = _f(1.0, "rollout nucleus sampling (1.0: off)", lo=0.0, hi=1.0, lo_open=True)
    tis_cap: float | None = _f(
        None,
        "truncated importance sampling for a sampler with its own kernels (rollout_engine=vllm): "
        "weight each token's policy-gradient term by min(pi_old / pi_sampler, tis_cap), pi_old "
        "the trainer's recomputed behaviour log-prob (verl, OpenRLHF: 2; None: off)",
        lo=1.0,
    )


NEUTRAL = {
    "builtin_shape": "auto",
    "vapo.value_pretrain_critic_lr": None,
    "vapo.value_pretrain_critic_epochs": None,
    "ppo.critic_replay": 1,
    "tools_prompt": "auto",
    "checkpoint_optimizer": True,
    "checkpoint_keep": 0,
}
"""Settings added after runs were first cached, at the value that computes what a config did before
the setting existed. Cache keys (a grid cell's identity, the pretrained critic's key) leave them out
at that value, so a grid or a cached critic from before the setting keeps its key. A setting added
later whose default keeps older runs' meaning belongs here ("section.field" for a nested one)."""


def without_neutral(resolved: dict) -> dict:
    """A resolved config dict (`to_dict`) without the NEUTRAL settings that are at their neutral value."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in resolved.items()}
    for path, neutral in NEUTRAL.items():
        *parents, name = path.split(".")
        node = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and name in node and node[name] == neutral:
            del node[name]
    return out


@dataclass
class RunConfig:
    """One training run."""

    task: str = _f(
        "chain",
        "task: a registered name (chain, longchain, math, math_tools, toolchain) or your class as path/to/file.py:Class or package.module:Class",
    )
    task_options: dict = _f({}, "keyword options for the task (e.g. data file paths for 'math')")
    model: str = _f(
        "builtin", "policy: 'builtin' (tiny model built and cached locally) or a local HF causal-LM dir"
    )
    builtin_shape: str = _f(
        "auto",
        "attention shape of the built-in and random models: default (heads of 16; random: 2 heads "
        "of 16), vllm (one head of 64; random: one of 32: shapes vLLM's CPU backend runs, usable "
        "with any engine, e.g. to compare engines on one model) or auto (vllm with "
        "rollout_engine=vllm, else default)",
        choices=("auto", "default", "vllm"),
    )
    critic_model: dict = _f(
        {},
        'built-in critic architecture, as TinyModelConfig overrides (e.g. {"hidden_size": 128, '
        '"num_hidden_layers": 4}): the reward model is then built on a base model of that shape, '
        "SFT'd like the policy ({}: the policy's shape)",
    )
    critic_init: str = _f(
        "auto",
        "critic initialisation: 'auto' (the built-in reward model for the built-in policy, "
        "else 'actor'), 'reward_model', 'actor' (the policy's backbone + a fresh value head) or a local dir",
    )
    model_dtype: str = _f(
        "float32",
        "dtype the models are loaded in: float32 master weights (AdamW at small learning rates "
        "needs them), bfloat16, float16, float64, or auto (the checkpoint's)",
        choices=("float32", "bfloat16", "float16", "float64", "auto"),
    )
    gradient_checkpointing: bool = _f(
        False,
        "recompute activations in the backward pass (transformers' gradient checkpointing, actor and critic)",
    )
    components: list = _f(list(COMPONENTS), "VAPO components switched on (the rest are vanilla PPO)")
    truncation: str = _f(
        "terminal",
        "a response cut by the length limit: terminal (scored like any other, as verl) or bootstrap (from V after its last token)",
        choices=("terminal", "bootstrap"),
    )
    rollout_engine: str = _f(
        "hf",
        "rollout engine, a name in vapo_lit.engines.ENGINES: hf (KV-cached token loop), cb (transformers' continuous batching; 2-3x slower on CPU, docs/guides/rollout-engines.md) or vllm (vLLM in process, an optional install: docs/guides/vllm.md)",
        choices=ROLLOUT_ENGINES,
    )
    observations: str = _f(
        "skip",
        "multi-turn tasks: how GAE crosses observation (tool output) spans: skip (carry the next value and the running advantage through unchanged, verl/NeMo-RL/AReaL), step (every token a timestep, SkyRL/ROLL/slime) or zero (values zeroed there, OpenRLHF; biased when gamma*lambda < 1); docs/algorithm.md",
        choices=("skip", "step", "zero"),
    )
    vllm_kv_cache_gib: float | None = _f(
        None,
        "rollout_engine=vllm: memory for vLLM's KV cache in GiB (None: room for its first "
        "call's responses at full length, at most a quarter of the free memory)",
        lo=0.0,
        lo_open=True,
    )
    advantage_estimator: str = _f(
        "gae",
        "gae (critic-based PPO) or grpo (critic-free group-normalised outcome: the GRPO baseline; "
        "with clip_higher, token_level_loss and dynamic_sampling, DAPO without overlong shaping)",
        choices=("gae", "grpo"),
    )
    gae_values: str = _f(
        "critic",
        "state values GAE reads: critic (the learned critic) or oracle (the task's true success "
        "probability from each state, measured from the policy's per-step error rates each "
        "iteration; longchain only). With oracle the critic still trains and is measured; only "
        "the advantages and targets use the true values",
        choices=("critic", "oracle"),
    )
    vapo: ComponentValues = field(
        default_factory=ComponentValues, metadata={"doc": "values the components apply"}
    )
    ppo: PPOConfig = field(default_factory=PPOConfig, metadata={"doc": "PPO settings"})
    steps: int = _f(100, "PPO iterations with actor updates (value pretraining comes on top)", lo=1)
    seed: int = _f(0, "seed of the run: prompt stream, sampling, mini-batch order", lo=0)
    model_seed: int = _f(
        0, "seed of the built-in base policy and reward model (every run seed starts from the same one)", lo=0
    )
    eval_every: int = _f(10, "evaluate every this many PPO iterations (0: only at start and end)", lo=0)
    eval_k: int = _f(8, "samples per eval prompt for avg@k (paper: 32)", lo=1)
    eval_top_p: float = _f(0.7, "eval nucleus (paper: 0.7)", lo=0.0, hi=1.0, lo_open=True)
    eval_temperature: float = _f(1.0, "eval temperature (paper: 1.0)", lo=0.0, lo_open=True)
    eval_problems: int | None = _f(None, "use only the first N eval problems (None: all)", lo=1)
    checkpoint_every: int = _f(10, "save last.ckpt every this many PPO iterations", lo=1)
    checkpoint_optimizer: bool = _f(
        True,
        "keep both optimizers' AdamW moments in the checkpoints, so an interrupted run "
        "resumes exactly (a checkpoint is then about 3x the models' weights); false: "
        "about 1x, and a resumed run starts the optimizers' moments afresh (it warns)",
    )
    checkpoint_keep: int = _f(
        0,
        "earlier checkpoints kept besides last.ckpt, as checkpoints/iter-NNNNNN.ckpt (each "
        "one more full checkpoint on disk; 0: last.ckpt only, replaced at every save)",
        lo=0,
    )
    samples_per_iteration: int = _f(
        4,
        "episodes of each iteration and of each evaluation written to the run folder's "
        "samples.jsonl (prompt, response, reward, verdict; observations and tool calls "
        "of a multi-turn episode) and W&B's samples table (0: none)",
        lo=0,
    )
    print_sample_every: int = _f(
        0, "print the prompt, response and reward of one episode every this many iterations (0: never)", lo=0
    )
    tools_prompt: str = _f(
        "auto",
        "chat tasks with tools (math_tools, and a task of yours that takes a tools_prompt "
        "option): template (the chat template's tools block, tools=), system (the tools as "
        "JSON schemas in a system message, Hermes/Qwen style) or auto (template when the "
        "template renders tools, else system, with a warning)",
        choices=("auto", "template", "system"),
    )
    out_dir: str = _f("runs", "where run folders go")
    name: str | None = _f(None, "run folder name (default: derived from components and seed)")
    wandb: str = _f(
        "auto",
        "W&B mode: auto (online if logged in, else offline), online, offline, disabled",
        choices=("auto", "online", "offline", "disabled"),
    )
    wandb_project: str = _f("vapo-lit", "W&B project")
    wandb_group: str | None = _f(None, "W&B group (a grid shares one)")
    wandb_job_type: str | None = _f(None, "W&B job_type (a grid's table row)")
    threads: int | None = _f(None, "torch CPU threads (None: torch's default)", lo=1)
    accelerator: str = _f(
        "auto",
        "Lightning accelerator: auto, cpu, gpu, cuda, mps",
        choices=("auto", "cpu", "gpu", "cuda", "mps"),
    )
    devices: str = _f("1", "Lightning devices: a count ('2'), a list ('0,1') or 'auto'")
    num_nodes: int = _f(1, "machines (Lightning num_nodes; each runs `devices` processes)", lo=1)
    strategy: str = _f(
        "auto",
        "data parallelism: auto (ddp when more than one device), ddp (one DistributedDataParallel "
        "per model), fsdp (actor and critic sharded)",
        choices=("auto", "ddp", "fsdp"),
    )
    precision: str = _f(
        "auto",
        "Lightning precision: auto (bf16-mixed on a GPU with bf16, else 32-true), 32-true, 64-true, "
        "bf16-mixed (fp32 master weights, bf16 compute), bf16-true",
        choices=("auto", "32-true", "64-true", "bf16-mixed", "bf16-true"),
    )
    cache_dir: str | None = _f(
        None, "cache of built models and pretrained critics (default ~/.cache/vapo-lit)"
    )


# ----------------------------------------------------------------------------- validation
AUTO_SIZED = ("ppo.rollout_batch_size", "ppo.logits_chunk")
"""Pass sizes that take 'auto' (resolved once at start by vapo_lit.devices.resolve_memory_defaults)."""


def check_range(path: str, value: Any, meta: dict) -> None:
    lo, hi, choices = meta.get("lo"), meta.get("hi"), meta.get("choices")
    if value is None or isinstance(value, bool):
        return
    if path in AUTO_SIZED and not (value == "auto" or isinstance(value, int)):
        raise ValueError(
            f"{path}={value!r} is not valid; give a positive integer, none (all at once) or auto"
        )
    if choices is not None and value not in choices:
        raise ValueError(f"{path}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and math.isnan(value):
            raise ValueError(f"{path} is NaN; {_range_text(meta)}")
        bad_lo = lo is not None and (value <= lo if meta.get("lo_open") else value < lo)
        bad_hi = hi is not None and (value >= hi if meta.get("hi_open") else value > hi)
        if bad_lo or bad_hi:
            raise ValueError(f"{path}={value!r} is out of range; {_range_text(meta)}")


def _range_text(meta: dict) -> str:
    lo, hi = meta.get("lo"), meta.get("hi")
    left = "(" if meta.get("lo_open") else "["
    right = ")" if meta.get("hi_open") else "]"
    if lo is not None and hi is not None:
        return f"valid range: {left}{lo}, {hi}{right}"
    if lo is not None:
        return f"valid range: {'>' if meta.get('lo_open') else '>='} {lo}"
    return f"valid range: {'<' if meta.get('hi_open') else '<='} {hi}"


def _clip_higher(values: dict, cfg: RunConfig) -> str | None:
    if values["eps_high"] < cfg.ppo.eps:
        return f"eps_high={values['eps_high']} is below eps_low=ppo.eps={cfg.ppo.eps}; valid: eps_high >= eps_low"
    return None


def _group_sampling(values: dict, cfg: RunConfig) -> str | None:
    k, n = values["samples_per_prompt"], cfg.ppo.responses_per_step
    return f"samples_per_prompt={k} must divide ppo.responses_per_step={n}" if n % k else None


def _dynamic_sampling(values: dict, cfg: RunConfig) -> str | None:
    if "group_sampling" not in cfg.components:
        return (
            "dynamic_sampling needs group_sampling: it drops groups whose samples all score the same, and a "
            "group of one response always does; valid: components with group_sampling"
        )
    return None


COMPONENT_CHECKS = {
    "clip_higher": _clip_higher,
    "group_sampling": _group_sampling,
    "dynamic_sampling": _dynamic_sampling,
}
"""Each component's rule across settings (beyond the ranges of its own values): name -> (its values,
the run config) -> what is wrong, or None. The one place each rule is written: `validate` asks it
for every named component (values from cfg.vapo), the component's callback asks it again in
`setup` with the values it was built with (components/base.py). Here, not in the component's file,
because config sits below components/ (which need Lightning)."""


def check_component(name: str, values: dict, cfg: RunConfig, where: str) -> None:
    """ValueError `where`.<what is wrong> when component `name`'s rule refuses `values` under `cfg`."""
    rule = COMPONENT_CHECKS.get(name)
    problem = rule(values, cfg) if rule else None
    if problem:
        raise ValueError(f"{where}.{problem}")


def validate(cfg: RunConfig) -> RunConfig:
    """Raise ValueError (naming the field, the value and what is valid) on any bad setting."""

    def walk(obj, prefix):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            path = f"{prefix}{f.name}"
            if dataclasses.is_dataclass(value):
                walk(value, path + ".")
            else:
                check_range(path, value, f.metadata)

    walk(cfg, "")
    check_components(cfg.components)
    _check_batch_sizes(cfg)
    values = dataclasses.asdict(cfg.vapo)
    for name in cfg.components:
        check_component(name, values, cfg, where="vapo")
    _check_estimator(cfg)
    return cfg


def _check_batch_sizes(cfg: RunConfig) -> None:
    """Mini- and micro-batches that fit the batch, and batches that split evenly over the processes."""
    devices = parse_devices(cfg.devices)
    p = cfg.ppo
    world = (
        len(devices) if isinstance(devices, list) else devices if isinstance(devices, int) else 1
    ) * cfg.num_nodes
    if world > 1:
        k = cfg.vapo.samples_per_prompt if "group_sampling" in cfg.components else 1
        prompts = p.responses_per_step // k
        for what, n in (
            ("prompts per step (ppo.responses_per_step / samples per prompt)", prompts),
            ("ppo.mini_batch_size", p.mini_batch_size),
        ):
            if n % world:
                raise ValueError(
                    f"{what} = {n} must be a multiple of the {world} processes (devices x num_nodes): "
                    "each rank takes whole prompt groups and an equal share of every mini-batch"
                )
    if p.mini_batch_size > p.responses_per_step:
        raise ValueError(
            f"ppo.mini_batch_size={p.mini_batch_size} exceeds ppo.responses_per_step={p.responses_per_step}; "
            "it must be <= responses_per_step"
        )
    if p.micro_batch_size > p.mini_batch_size:
        raise ValueError(
            f"ppo.micro_batch_size={p.micro_batch_size} exceeds ppo.mini_batch_size={p.mini_batch_size}"
        )
    critic_mb = p.critic_mini_batch_size or p.mini_batch_size
    if critic_mb > p.responses_per_step:
        raise ValueError(
            f"ppo.critic_mini_batch_size={critic_mb} exceeds ppo.responses_per_step={p.responses_per_step}; "
            "it must be <= responses_per_step"
        )
    if world > 1 and critic_mb % world:
        raise ValueError(
            f"ppo.critic_mini_batch_size = {critic_mb} must be a multiple of the {world} processes "
            "(devices x num_nodes)"
        )


def _check_estimator(cfg: RunConfig) -> None:
    """The settings that need a critic, or the sampler's and the trainer's log-probs, have them."""
    p = cfg.ppo
    if cfg.advantage_estimator == "grpo" and cfg.gae_values == "oracle":
        raise ValueError(
            "gae_values=oracle replaces a critic's values in GAE; advantage_estimator=grpo has neither: "
            "use advantage_estimator=gae with it"
        )
    if p.tis_cap is not None and p.recompute_logprobs is False:
        raise ValueError(
            f"ppo.tis_cap={p.tis_cap} weighs the trainer's behaviour log-probs against the sampler's, but "
            "ppo.recompute_logprobs=false keeps only the sampler's; set ppo.recompute_logprobs to true or "
            "none (auto), or ppo.tis_cap to none"
        )
    if cfg.advantage_estimator == "grpo":
        critic_parts = [
            c for c in ("value_pretraining", "decoupled_gae", "length_adaptive_gae") if c in cfg.components
        ]
        if critic_parts:
            raise ValueError(
                f"advantage_estimator=grpo is critic-free: {', '.join(critic_parts)} do not apply; valid with grpo: "
                "token_level_loss, clip_higher, positive_lm_loss, group_sampling (and the optional kl_penalty, dynamic_sampling)"
            )
        if "group_sampling" not in cfg.components:
            raise ValueError(
                "advantage_estimator=grpo needs group_sampling (the baseline is the group's mean score)"
            )


def parse_devices(text):
    """'auto' | '2' | '0,1' as Lightning's devices argument (ValueError otherwise)."""
    t = str(text).strip()
    if t == "auto":
        return t
    try:
        if "," in t:
            ids = [int(x) for x in t.split(",") if x.strip()]
            if ids and all(i >= 0 for i in ids):
                return ids
        elif int(t) >= 1:
            return int(t)
    except ValueError:
        pass
    raise ValueError(f"devices={text!r} is not valid; give a count (2), a list of device ids (0,1) or auto")


# ----------------------------------------------------------------------------- dict round trip
def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(data: dict, cls=RunConfig):
    """Build a (nested) config from a dict; unknown keys raise with the valid ones listed."""
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__} expects a mapping; got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            raise ValueError(f"unknown setting {key!r} in {cls.__name__}; valid: {', '.join(fields)}")
        sub = _nested_type(cls, key)
        kwargs[key] = from_dict(value, sub) if sub is not None else value
    return cls(**kwargs)


def _nested_type(cls, name):
    if cls is RunConfig:
        return {"vapo": ComponentValues, "ppo": PPOConfig}.get(name)
    return None


def nest(flat: dict) -> dict:
    """{'vapo.alpha': 1} -> {'vapo': {'alpha': 1}} (dotted config paths to a nested delta)."""
    out: dict = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def merge(cfg, delta: dict):
    """A copy of `cfg` with the (nested) `delta` applied."""
    base = to_dict(cfg)

    def deep(a, b):
        for k, v in b.items():
            if isinstance(v, dict) and isinstance(a.get(k), dict) and k != "task_options":
                deep(a[k], v)
            else:
                a[k] = v
        return a

    return from_dict(deep(base, delta), type(cfg))


# ----------------------------------------------------------------------------- flat field paths
def field_type(annotation):
    """The concrete type of an annotation (`int | None` -> int)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


def walk_fields(cls=None, prefix: str = ""):
    """(dotted path, type, dataclass field) of every leaf setting: 'steps', 'ppo.actor_lr', ..."""
    cls = RunConfig if cls is None else cls
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = field_type(hints[f.name])
        if dataclasses.is_dataclass(kind):
            yield from walk_fields(kind, prefix + f.name + ".")
        else:
            yield prefix + f.name, kind, f


def field_paths() -> set[str]:
    return {path for path, _, _ in walk_fields()}
