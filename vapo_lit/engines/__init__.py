"""Rollout engines: the seam between the trainer and whatever samples responses.

    engine = make_engine("hf", actor, tokenizer)
    engine.load_weights(actor)                       # after every actor update
    ro = engine.generate(prompts, SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=256), seeds)

Training, evaluation and the built-in model builder all sample through this protocol. An engine
returns a :class:`~vapo_lit.rollout.Rollout` (left-padded prompts, right-padded responses, EOS vs
truncation flags, behaviour log-probs of the sampled tokens recorded at sampling time), seeds each
response by its own seed (vapo_lit.rng), and must pass the contract tests in `tests/test_engines.py`.

Backends:

* ``hf`` -- :class:`HFEngine`, a KV-cached token loop over any transformers causal LM, sharing the
  actor's weights in place (``load_weights`` points it at the module it is given).
* ``cb`` -- :class:`ContinuousBatchingEngine`, transformers' continuous batching (paged KV cache,
  finished responses leave the batch) with vapo-lit's per-sample sampler and behaviour log-probs
  recomputed by one forward pass (see its module docstring; docs/guides/rollout-engines.md has the
  measured speed of both).

* ``vllm`` -- :class:`~vapo_lit.engines.vllm.VLLMEngine`, vLLM's offline engine colocated in the
  training process (its CUDA build, or its CPU build), the actor's weights pushed into it in place
  after every update; its log-probs come from its own kernels, so the trainer recomputes the
  behaviour log-probs by default and logs the gap (docs/guides/vllm.md). vLLM is an optional
  dependency: the engine imports it when it is first used.

A remote engine (SGLang, a vLLM server) plugs in the same way: ``load_weights`` pushes the actor's
state dict to the server after each update and ``generate`` returns its tokens and log-probs; an
engine whose log-probs come from its own kernels sets ``own_kernels = True`` and the trainer
recomputes them (see docs/guides/rollout-engines.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from vapo_lit.config import ROLLOUT_ENGINES
from vapo_lit.rollout import Rollout


@dataclass(frozen=True)
class SamplingParams:
    """How to sample (the paper's rollouts: temperature 1.0; eval: temperature 1.0, top-p 0.7)."""

    max_new_tokens: int
    """Response-length limit; a response that reaches it without EOS is `truncated`."""
    temperature: float = 1.0
    """Softmax temperature; 0 = greedy. Behaviour log-probs are log softmax(logits / T)."""
    top_p: float = 1.0
    """Nucleus sampling (1.0: off). Log-probs are recorded before the nucleus cut."""

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1; got {self.max_new_tokens}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1]; got {self.top_p}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0; got {self.temperature}")


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer needs of a sampler."""

    def generate(self, prompts: list[str], sampling: SamplingParams, seeds) -> Rollout:
        """One response per prompt. `seeds`: one int per prompt (an int: expanded per row, see
        vapo_lit.rollout.as_seeds). Response i must be a deterministic function of (weights,
        prompts[i], sampling, seeds[i]) alone, whatever else is in the batch (up to float
        reduction order), so that chunking and data-parallel sharding do not change results."""

    def load_weights(self, actor) -> None:
        """Make the engine sample from `actor`'s current weights (called after every actor update)."""


def make_engine(name: str, actor, tokenizer, task=None, cfg=None) -> RolloutEngine:
    """An engine by name (see ENGINES); ValueError listing the valid names. A multi-turn `task`
    (vapo_lit.tasks.env.Environment) gets an episode loop: vapo_lit.engines.episodes on the `hf`
    engine's token loop, or the `vllm` engine's own. `cfg`: the run config, for an engine with settings of its own
    (its class's `from_config`)."""
    if name not in ENGINES:
        raise ValueError(f"rollout engine {name!r} is not known; valid: {', '.join(ENGINES)}")
    from vapo_lit.tasks.env import is_environment

    if is_environment(task):
        if name == "vllm":  # its own episode loop: each turn resubmitted, the prefix cache reused
            return VLLMEngine(
                actor, tokenizer, kv_cache_gib=getattr(cfg, "vllm_kv_cache_gib", None), env=task
            )
        if name != "hf":
            raise ValueError(
                f"rollout engine {name!r} cannot run the multi-turn task {task.name!r} "
                "(an environment between turns); use rollout_engine=hf or vllm"
            )
        from vapo_lit.engines.episodes import EpisodeEngine

        return EpisodeEngine(actor, tokenizer, task)
    engine = ENGINES[name]
    if cfg is not None and hasattr(engine, "from_config"):
        return engine.from_config(actor, tokenizer, cfg)
    return engine(actor, tokenizer)


from vapo_lit.engines.continuous import ContinuousBatchingEngine  # noqa: E402  (registry below needs the classes)
from vapo_lit.engines.hf import HFEngine  # noqa: E402
from vapo_lit.engines.vllm import VLLMEngine  # noqa: E402  (imports vLLM itself only when first used)

ENGINES = dict(zip(ROLLOUT_ENGINES, (HFEngine, ContinuousBatchingEngine, VLLMEngine), strict=True))


def own_kernels(name: str) -> bool:
    """Whether engine `name` computes its log-probs with kernels of its own (the trainer then
    recomputes the behaviour log-probs by default: vapo_lit.devices.recompute_logprobs)."""
    return bool(getattr(ENGINES.get(name), "own_kernels", False))


__all__ = [
    "SamplingParams",
    "RolloutEngine",
    "HFEngine",
    "ContinuousBatchingEngine",
    "VLLMEngine",
    "ENGINES",
    "make_engine",
    "own_kernels",
    "Rollout",
]
