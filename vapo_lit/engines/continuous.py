"""`ContinuousBatchingEngine` ("cb"): transformers' continuous batching with vapo-lit's sampler.

transformers' continuous batching (`model.init_continuous_batching`, the machinery behind
`generate_batch`) keeps a paged KV cache and a scheduler that packs the active requests into one
ragged forward pass per step: a finished response leaves the batch at once, so no compute is spent
on padding rows that are already done. This engine uses that machinery as it is (scheduler, paged
cache, per-request EOS and length limits) and replaces two things, for reasons measured on
transformers 5.24 (docs/guides/rollout-engines.md):

* **sampling**: its sampler draws with `torch.multinomial` from the process-wide torch RNG, which
  `ContinuousBatchingConfig.seed` re-seeds once per manager (so it also resets the trainer's
  global RNG). A response then depends on which requests share its steps. Here a logits processor
  (:class:`CounterSampler`) draws request i's token t by inverse CDF with
  ``vapo_lit.rng.uniforms(seed_i, t)`` -- the draw of :class:`~vapo_lit.engines.HFEngine`, with
  the uniform rounded down to 32 bits -- and leaves only that token finite, so the manager's
  greedy pick returns it. Response i depends on (weights, prompt i, seed i) alone.
* **behaviour log-probs**: its `return_logprobs` gives log softmax of the *processed* scores,
  i.e. after its own top-p renormalisation (and here they would be 0, since only the drawn
  token stays finite). The engine recomputes them with one teacher-forced forward pass of the same
  module (``vapo_lit.passes.sequence_logprobs``: log softmax(logits / T) of the sampled token,
  before top-p), the numerics of the training update itself.

`load_weights`: the manager runs the actor module itself (built afresh for each `generate`
call, its attention switched to a paged-cache-friendly one for the call and restored after), so
an update is visible at once; like HFEngine, `load_weights` only follows a rebuilt module.
The model must be a transformers `PreTrainedModel` (it carries `init_continuous_batching`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import time
from typing import ClassVar

import torch

from vapo_lit.algos.losses import at_least_float32
from vapo_lit.rng import uniforms
from vapo_lit.engines.sampling import sample_next
from vapo_lit.passes import sequence_logprobs
from vapo_lit.rollout import Rollout, as_seeds, encode_prompts, eos_ids_of, pad_id_of

_SEED, _PROMPT_LEN = "vapo_seed", "vapo_prompt_len"  # per-request keyword arguments of the sampler


PAGE_SIZE_NAMES = ("page_size", "block_size")
"""What `ContinuousBatchingConfig` calls the tokens per KV-cache page, newest name first: the field
was renamed within the transformers versions that have these classes (5.17 has block_size, later
ones page_size; the same quantity, with num_blocks counting those pages either way)."""
CONFIG_FIELDS = (
    "num_blocks",
    "max_batch_tokens",
    "max_requests_per_batch",
    "use_async_batching",
    "allow_block_sharing",
    "seed",
)
"""The other `ContinuousBatchingConfig` fields the engine sets."""


def _import_cb():
    """The continuous-batching classes; ImportError saying what is missing. Found by what the
    installed transformers has (its classes and their fields), not by its version number."""
    import transformers

    try:
        from transformers import GenerationConfig, LogitsProcessorList
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
        from transformers.generation.continuous_batching.cb_logits_processors import (
            ContinuousBatchingLogitsProcessor,
            ContinuousBatchingLogitsProcessorList,
        )
        from transformers.generation.continuous_batching.utils import WorkloadHints
    except ImportError as e:  # pragma: no cover - depends on the installed transformers
        raise ImportError(
            f"rollout engine 'cb' needs transformers' continuous batching with per-request logits "
            f"processors, which transformers {transformers.__version__} does not have ({e}); "
            "use rollout_engine=hf"
        ) from e
    fields = _fields(ContinuousBatchingConfig)
    missing = [n for n in CONFIG_FIELDS if n not in fields]
    if not any(n in fields for n in PAGE_SIZE_NAMES):
        missing.insert(0, " or ".join(PAGE_SIZE_NAMES))
    if missing:  # pragma: no cover - depends on the installed transformers
        raise ImportError(
            f"rollout engine 'cb' needs ContinuousBatchingConfig fields that transformers "
            f"{transformers.__version__} lacks: {', '.join(missing)} (use rollout_engine=hf)"
        )
    return (
        GenerationConfig,
        LogitsProcessorList,
        ContinuousBatchingConfig,
        ContinuousBatchingLogitsProcessor,
        ContinuousBatchingLogitsProcessorList,
        WorkloadHints,
    )


@functools.lru_cache(maxsize=1)
def memory_unmeasured() -> str | None:
    """Why transformers' continuous batching cannot size its KV cache on this machine (one line), or
    None. It checks the cache against the memory its `get_device_and_memory_breakdown` reports; on a
    machine without CUDA some versions (5.17) read a CPU's memory only through psutil and report 0
    without it, and then refuse every request. Asked of transformers itself (never on a CUDA machine,
    whose memory it always measures, so that no CUDA context is made here)."""
    if torch.cuda.is_available():
        return None
    import transformers

    try:
        from transformers.generation.continuous_batching.utils import get_device_and_memory_breakdown
    except ImportError:
        try:
            from transformers.generation.continuous_batching.requests import get_device_and_memory_breakdown
        except ImportError:  # pragma: no cover - depends on the installed transformers
            return None
    device, total = get_device_and_memory_breakdown()[:2]
    if total > 0:
        return None
    return (
        f"rollout engine 'cb': transformers {transformers.__version__} reads this machine's {device.type} memory "
        "as 0 (it needs psutil for that), so its continuous batching would refuse every request; "
        "pip install psutil, or use rollout_engine=hf"
    )


def unavailable() -> str | None:
    """Why the cb engine cannot run here (one line: its classes are missing, or transformers cannot
    measure the memory its cache must fit in), or None."""
    try:
        _import_cb()
    except ImportError as e:
        return str(e)
    return memory_unmeasured()


def _fields(cls) -> set[str]:
    return set(inspect.signature(cls).parameters)


def page_size_kwarg(config_cls, tokens: int) -> dict:
    """{name: tokens} under the name `config_cls` (a ContinuousBatchingConfig) gives the page size."""
    fields = _fields(config_cls)
    return {next(n for n in PAGE_SIZE_NAMES if n in fields): tokens}


def uniform_bits(seeds: torch.LongTensor, steps: torch.LongTensor) -> torch.Tensor:
    """(n,) int32 holding the top 32 bits of ``uniforms(seeds[i], steps[i])`` (the 32-bit slot a
    continuous-batching logits processor gets per request)."""
    u = uniforms(seeds, steps)
    bits = (u * 2.0**32).long()  # exact: u has 53 bits, the product is < 2**32
    return torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)


def bits_to_uniform(bits: torch.Tensor) -> torch.Tensor:
    """Inverse of the packing in :func:`uniform_bits`: float64 in [0, 1)."""
    return (bits.long() & 0xFFFFFFFF).double() * (1.0 / 2**32)


def on_device(ro: Rollout, device) -> Rollout:
    """`ro` with every tensor on `device`, dtypes kept: the Rollout convention (the sampling model's
    device, as `hf` returns it), so the critic and update passes never meet CPU ids on a GPU run."""
    moved = {
        f.name: getattr(ro, f.name).to(device)
        for f in dataclasses.fields(ro)
        if isinstance(getattr(ro, f.name), torch.Tensor)
    }
    return dataclasses.replace(ro, **moved)


def _make_sampler_classes():
    (
        _,
        LogitsProcessorList,
        _,
        ContinuousBatchingLogitsProcessor,
        ContinuousBatchingLogitsProcessorList,
        _,
    ) = _import_cb()

    class CounterSampler(ContinuousBatchingLogitsProcessor):
        """Draws each request's next token from its own counter-based stream and returns scores
        that are -inf everywhere else (the manager then picks it greedily)."""

        supported_kwargs: ClassVar[dict[str, type]] = {_SEED: int, _PROMPT_LEN: int}
        ignored_kwargs = ()

        def __init__(self, temperature: float, top_p: float):
            self.temperature, self.top_p = temperature, top_p

        def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
            int32_tensor.zero_()

        def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
            # Step = tokens this response already has. A request the cache pre-empted comes back
            # with its generated tokens moved into its prompt, so count from the true prompt length.
            states = [r.state for r in requests_with_new_token]
            seeds = torch.tensor([s.logit_processor_kwargs[_SEED] for s in states], dtype=torch.int64)
            steps = torch.tensor(
                [
                    len(s.initial_tokens) + s.generated_len() - s.logit_processor_kwargs[_PROMPT_LEN]
                    for s in states
                ],
                dtype=torch.int64,
            )
            return uniform_bits(seeds, steps)

        def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
            u = bits_to_uniform(tensor_arg[: scores.shape[0]])
            tok, _ = sample_next(scores, temperature=self.temperature, top_p=self.top_p, u=u)
            only = torch.full_like(scores, float("-inf"))
            return only.scatter_(-1, tok[:, None], 0.0)

    class SamplerList(ContinuousBatchingLogitsProcessorList):
        """The manager's processor list holding only the sampler (one int32 argument per request)."""

        def __init__(self, sampler):
            super().__init__(LogitsProcessorList([sampler]))
            self.tensors_required = 1

    return CounterSampler, SamplerList


class ContinuousBatchingEngine:
    """Rollouts through transformers' continuous batching; see the module docstring."""

    name = "cb"
    page_size = 32
    """Tokens per KV-cache page (transformers' default 256 wastes most of a page on short responses)."""
    max_batch_tokens = 2048
    """Query tokens per forward step (prefill chunks and decode tokens together)."""
    max_requests_per_batch: int | None = 64
    """Requests per forward step (None: all). Without flash-attention kernels (CPU) each step's
    attention is dense over every key of the step under a block-diagonal mask, so its cost grows
    with the square of the requests in the step. 64 is the smallest cap that was as fast as the
    best one when 512 responses of up to 64 tokens were timed on a 2-core CPU with all, 128, 64 and
    32 requests per step (re-time it with benchmarks/engines.py on other hardware)."""
    logprob_tokens = 1 << 22
    """Rows x columns x vocabulary per chunk of the log-prob recomputation (bounds its logits memory)."""

    def __init__(self, actor, tokenizer):
        self.model, self.tokenizer = actor, tokenizer
        self.CounterSampler, self.SamplerList = _make_sampler_classes()
        why = memory_unmeasured()
        if why:
            raise RuntimeError(why)
        self.recompute_seconds = 0.0
        """Seconds the last `generate` spent recomputing behaviour log-probs (benchmarks/engines.py)."""

    def load_weights(self, actor) -> None:
        # The manager runs this very module: an update is visible at once. Follow a rebuilt one.
        self.model = actor

    def generate(self, prompts: list[str], sampling, seeds) -> Rollout:
        if not hasattr(self.model, "init_continuous_batching"):
            raise TypeError(
                f"rollout engine 'cb' needs a transformers PreTrainedModel; got "
                f"{type(self.model).__name__} (use rollout_engine='hf' for other modules)"
            )
        tok = self.tokenizer
        prompt_ids, prompt_mask = encode_prompts(tok, prompts)
        n = prompt_ids.shape[0]
        row_seeds = as_seeds(seeds, n)
        eos = eos_ids_of(self.model, tok)
        inputs = [prompt_ids[i, prompt_mask[i].bool()].tolist() for i in range(n)]
        was_training = self.model.training  # the manager puts the model in eval mode and leaves it there
        try:
            outputs = self._sample(inputs, row_seeds.tolist(), sampling, eos)
            ro = self._rollout(prompt_ids, prompt_mask, outputs, eos, sampling)
        finally:
            self.model.train(was_training)
        return ro

    def _cb_config(self, inputs, max_new_tokens: int):
        _, _, ContinuousBatchingConfig, _, _, WorkloadHints = _import_cb()
        cfg = ContinuousBatchingConfig(
            **page_size_kwarg(ContinuousBatchingConfig, self.page_size),
            num_blocks=self.cache_pages(inputs, max_new_tokens),
            max_batch_tokens=max(self.max_batch_tokens, len(inputs)),
            max_requests_per_batch=self.max_requests_per_batch,
            # synchronous steps: the sampler reads each request's step when
            # its batch is prepared (async batching prepares one step ahead)
            use_async_batching=False,
            allow_block_sharing=False,
            seed=0,
        )
        hints = WorkloadHints(
            max_prompt_length=max(len(x) for x in inputs),
            max_generated_length=max_new_tokens,
            num_requests=len(inputs),
        )
        return cfg, hints

    def cache_pages(self, inputs: list[list[int]], max_new_tokens: int) -> int:
        """KV-cache pages: room for every request at full length, so nothing is pre-empted, and the
        cache is not sized from free memory (on CPU: 80% of RAM, zero-filled on every call)."""
        longest = max(len(x) for x in inputs) + max_new_tokens
        return len(inputs) * math.ceil(longest / self.page_size)

    def _sample(self, inputs: list[list[int]], seeds: list[int], sampling, eos: list[int]) -> list[list[int]]:
        """Response token lists in input order (EOS included when emitted)."""
        GenerationConfig = _import_cb()[0]
        gen = GenerationConfig(
            do_sample=False,
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=eos,
            pad_token_id=pad_id_of(self.tokenizer),
        )
        cb_config, hints = self._cb_config(inputs, sampling.max_new_tokens)
        # `seed` makes the manager call torch.manual_seed; fork_rng keeps the caller's RNG untouched.
        device = next(self.model.parameters()).device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.inference_mode():
            # inference_mode: the manager's thread inherits it (grad mode alone is thread-local)
            manager = self.model.init_continuous_batching(
                generation_config=gen, continuous_batching_config=cb_config, workload_hints=hints
            )
            # The batch processor is built from this attribute when the manager starts.
            manager.logit_processor = self.SamplerList(
                self.CounterSampler(sampling.temperature, sampling.top_p)
            )
            results = {}
            manager.start()
            try:
                for i, (ids, seed) in enumerate(zip(inputs, seeds)):
                    manager.add_request(
                        ids,
                        request_id=str(i),
                        max_new_tokens=sampling.max_new_tokens,
                        eos_token_id=eos,
                        **{_SEED: int(seed), _PROMPT_LEN: len(ids)},
                    )
                while len(results) < len(inputs):
                    out = manager.get_result(timeout=1)
                    if out is not None and out.is_finished():
                        results[out.request_id] = out
                    elif out is None and not manager.is_running():
                        raise RuntimeError(
                            "transformers' continuous-batching thread stopped before every response "
                            f"was done ({len(results)}/{len(inputs)}); see its log above"
                        )
            finally:
                manager.stop(block=True)
                manager.destroy()
        failed = [(k, r.error) for k, r in results.items() if r.error is not None]
        if failed:
            raise RuntimeError(
                f"continuous batching failed on {len(failed)} request(s); first: {failed[0][1]}"
            )
        return [list(results[str(i)].generated_tokens) for i in range(len(inputs))]

    @torch.no_grad()
    def _rollout(self, prompt_ids, prompt_mask, outputs, eos, sampling) -> Rollout:
        n, pad = len(outputs), pad_id_of(self.tokenizer)
        lengths = torch.tensor([len(o) for o in outputs], dtype=torch.long)
        terminated = torch.tensor([bool(o) and o[-1] in eos for o in outputs])
        r = int(lengths.max())
        response_ids = torch.full((n, r), pad, dtype=torch.long)
        for i, o in enumerate(outputs):
            response_ids[i, : len(o)] = torch.tensor(o, dtype=torch.long)
        response_mask = (torch.arange(r)[None, :] < lengths[:, None]).float()
        t0 = time.perf_counter()
        logprobs = self._behaviour_logprobs(
            prompt_ids, prompt_mask, response_ids, response_mask, sampling.temperature
        )
        self.recompute_seconds = time.perf_counter() - t0
        texts = self.tokenizer.batch_decode(outputs, skip_special_tokens=True)
        return on_device(
            Rollout(
                prompt_ids=prompt_ids,
                prompt_mask=prompt_mask,
                response_ids=response_ids,
                response_mask=response_mask,
                logprobs=logprobs,
                lengths=lengths,
                terminated=terminated,
                truncated=~terminated,
                texts=list(texts),
            ),
            next(self.model.parameters()).device,
        )

    def _behaviour_logprobs(
        self, prompt_ids, prompt_mask, response_ids, response_mask, temperature
    ) -> torch.Tensor:
        """(N, R) log softmax(logits / T) of each response token (at least float32: a float64 model keeps
        float64, as `hf` does), one forward pass per chunk of rows."""
        device = next(self.model.parameters()).device
        self.model.eval()
        P = prompt_ids.shape[1]
        ids = torch.cat([prompt_ids, response_ids], 1)
        mask = torch.cat([prompt_mask.long(), response_mask.long()], 1)
        vocab = int(self.model.get_output_embeddings().weight.shape[0])
        rows = max(1, self.logprob_tokens // (ids.shape[1] * vocab))
        out = []
        for i in range(0, ids.shape[0], rows):
            lp = sequence_logprobs(
                self.model,
                ids[i : i + rows].to(device),
                mask[i : i + rows].to(device),
                temperature=temperature,
            )
            out.append(at_least_float32(lp[:, P - 1 :]))
        return torch.cat(out) * response_mask.to(device)
