"""Rollout engines side by side in one run, on the built-in task and the default config's shapes.

    python benchmarks/engines.py             # 3 interleaved repetitions of each shape
    python benchmarks/engines.py --reps 5
    python benchmarks/engines.py --quick     # 1 repetition, max_new_tokens 64 (a smoke run)
    python benchmarks/engines.py --long      # hf vs cb at 32 responses x 1,024 tokens (EOS suppressed)
    python benchmarks/engines.py --vllm      # hf vs cb vs vllm on the built-in task's vLLM-variant policy
    python benchmarks/engines.py --vllm --long --reps 1   # hf vs cb vs vllm, 32 x 1,024 on a 100M-class Llama
    python benchmarks/engines.py --vllm --long --reps 1 --shape 8x256 --engines hf,vllm   # a smaller long shape

Engines timed (`engine.generate`, one torch thread, the built-in SFT policy in float32):

* ``hf``  -- HFEngine, the KV-cached token loop (vapo_lit.engines.hf.generate).
* ``cb``  -- ContinuousBatchingEngine: transformers' continuous batching with vapo-lit's per-sample
  sampler; its seconds include the behaviour log-prob recomputation (printed apart).
* ``cb-native`` -- transformers' own `generate_batch` with its own sampler and `return_logprobs`
  (not a valid engine: it fails the contract, measured below; timed for reference, as the cost
  of continuous batching without vapo-lit's sampler or recomputation).

* ``vllm`` -- VLLMEngine: vLLM in process (`--vllm`; needs vLLM, e.g. .venv-vllm from `make test-vllm`).
  Its start-up (import, engine, first weight push) happens once, before the timings, and is printed
  apart, as is one `load_weights` (the per-update weight sync). With `--vllm` every engine samples
  the built-in task's vLLM-variant policy (one attention head of 64: vLLM's CPU backend refuses the
  default's head size 16), and with `--vllm --long` a 100M-class Llama with random weights (hidden
  768, 12 layers of 12 heads of 64, MLP 2048, a synthetic 32,000-word vocabulary; 110M parameters),
  sampling 32 responses of exactly 1,024 tokens. vLLM's responses come from its own random stream, so
  they differ from hf's and cb's (hf and cb draw the same ones).

Shapes, from the `default` preset: "rollout" = one iteration (ppo.responses_per_step = 64
responses: group sampling's 64 / samples_per_prompt train prompts x samples_per_prompt = 8 x 8,
the task's max_new_tokens = 228, ppo.temperature 1.0, ppo.top_p 1.0); "eval" = one call of the
preset's whole eval (eval_problems = 64 prompts x eval_k = 8 = 512 responses, eval_temperature
1.0, eval_top_p 0.7; `vapo_lit.evaluation.evaluate` sends it in two calls of 256). `--long` instead
times one shape of VAPO's regime: 4 prompts x 8 samples, every response exactly 1,024 tokens (no
token counts as EOS), hf and cb only (transformers' own sampler cannot be told to ignore EOS). Every repetition uses new seeds, the same
for every engine, and the engines run in a rotating order. Printed per engine: seconds per call
and generated (response) tokens per second, median [min-max], and the ratio to hf (time / hf time).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from vapo_lit.config import RunConfig, merge
from vapo_lit.engines import ContinuousBatchingEngine, SamplingParams, make_engine
from vapo_lit.engines.continuous import page_size_kwarg
from vapo_lit.models import load_policy
from vapo_lit.presets import PRESETS
from vapo_lit.rng import sample_seed
from vapo_lit.passes import sequence_logprobs
from vapo_lit.rollout import encode_prompts, eos_ids_of, pad_id_of
from vapo_lit.tasks import get_task


def native_cb(model, tok, prompts, sampling, seed: int):
    """transformers' generate_batch with its own sampler: (token lists, its log-prob lists)."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    ids, mask = encode_prompts(tok, prompts)
    inputs = [ids[i, mask[i].bool()].tolist() for i in range(len(prompts))]
    sizing = ContinuousBatchingEngine(model, tok)  # the same cache sizing as the "cb" engine
    pages = sizing.cache_pages(inputs, sampling.max_new_tokens)
    gen = GenerationConfig(
        do_sample=True,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=0,
        max_new_tokens=sampling.max_new_tokens,
        eos_token_id=eos_ids_of(model, tok),
        pad_token_id=pad_id_of(tok),
    )
    cfg = ContinuousBatchingConfig(
        **page_size_kwarg(ContinuousBatchingConfig, sizing.page_size),
        num_blocks=pages,
        max_batch_tokens=max(sizing.max_batch_tokens, len(inputs)),
        use_async_batching=False,
        max_requests_per_batch=sizing.max_requests_per_batch,
        allow_block_sharing=False,
        return_logprobs=True,
        seed=seed,
    )
    with torch.inference_mode():
        out = model.generate_batch(
            inputs, generation_config=gen, continuous_batching_config=cfg, progress_bar=False
        )
    results = list(out.values())  # in input order
    assert len(results) == len(prompts) and all(r.error is None for r in results)
    return [list(r.generated_tokens) for r in results], [list(r.logprobs) for r in results]


def recomputed_logprobs(model, tok, prompts, responses, temperature):
    """The training convention (log softmax(logits / T) of each response token), flattened."""
    ids, mask = encode_prompts(tok, prompts)
    r = max(len(x) for x in responses)
    resp = torch.full((len(prompts), r), pad_id_of(tok), dtype=torch.long)
    rmask = torch.zeros((len(prompts), r), dtype=torch.long)
    for i, x in enumerate(responses):
        resp[i, : len(x)] = torch.tensor(x)
        rmask[i, : len(x)] = 1
    with torch.no_grad():
        lp = sequence_logprobs(
            model, torch.cat([ids, resp], 1), torch.cat([mask, rmask], 1), temperature=temperature
        )[:, ids.shape[1] - 1 :]
    return lp[rmask.bool()]


def native_contract_check(model, tok, prompts, sampling, batch_check: bool) -> str:
    """What transformers' own sampler does to the contract, measured on this shape: its log-probs
    against the convention, and (batch_check) whether a response survives a change of batch and
    whether the caller's RNG survives the call."""
    before = torch.get_rng_state()
    toks, lps = native_cb(model, tok, prompts, sampling, seed=7)
    rng_changed = not torch.equal(before, torch.get_rng_state())
    native = torch.tensor([x for row in lps for x in row], dtype=torch.float64)
    diff = native - recomputed_logprobs(model, tok, prompts, toks, sampling.temperature).double()
    line = (
        f"  cb-native: its log-probs - log softmax(logits/T): max |diff| {diff.abs().max():.2e}, "
        f"mean {diff.mean():+.2e} (top-p {sampling.top_p})"
    )
    if batch_check:
        alone = [native_cb(model, tok, [prompts[i]], sampling, seed=7)[0][0] for i in range(0, 64, 8)]
        same = sum(a == toks[i] for a, i in zip(alone, range(0, 64, 8)))
        line += (
            f"; requests 0, 8, .., 56 sampled alone with the same seed: {same}/8 responses as in the full "
            f"batch; the caller's torch RNG {'was re-seeded' if rng_changed else 'survived'}"
        )
    return line


def run_shape(
    label, model, tok, prompt_sets, sampling, reps: int, batch_check: bool, names=("hf", "cb", "cb-native")
):
    names = list(names)
    secs = {n: [] for n in names}
    toks = {n: [] for n in names}
    recompute, same = [], 0
    warm = SamplingParams(8, temperature=sampling.temperature, top_p=sampling.top_p)
    engines = {}
    for name in names:  # one-time costs (imports, first allocations, vLLM's start-up) out of the timings
        t0 = time.perf_counter()
        if name == "cb-native":
            native_cb(model, tok, prompt_sets[0][:4], warm, 0)
        elif (
            name == "vllm"
        ):  # its KV cache sized for the shape (its own default sizes it from the first call)
            from vapo_lit.engines.vllm import VLLMEngine, kv_gib

            longest = max(len(tok(p)["input_ids"]) for p in prompt_sets[0]) + sampling.max_new_tokens
            tokens = max(
                len(prompt_sets[0]) * longest, model.config.max_position_embeddings + 256
            )  # (vLLM's floor)
            engines[name] = VLLMEngine(
                model, tok, kv_cache_gib=1.05 * kv_gib(model.config, model.dtype, tokens)
            )
            engines[name].generate(prompt_sets[0][:4], warm, 0)
        else:
            make_engine(name, model, tok).generate(prompt_sets[0][:4], warm, 0)
        if name == "vllm":
            print(
                f"  vllm: start-up (import, engine, first weight push, first call) {time.perf_counter() - t0:.1f} s"
            )
    for rep in range(reps):
        prompts = prompt_sets[rep]
        seeds = [sample_seed(rep, i) for i in range(len(prompts))]
        texts = {}
        for name in names[rep % len(names) :] + names[: rep % len(names)]:  # rotate the order
            t0 = time.perf_counter()
            if name == "cb-native":
                out, _ = native_cb(model, tok, prompts, sampling, seed=rep)
                n_tok = sum(len(x) for x in out)
            else:
                engine = engines[name] if name == "vllm" else make_engine(name, model, tok)
                ro = engine.generate(prompts, sampling, seeds)
                n_tok, texts[name] = int(ro.lengths.sum()), ro.texts
                if name == "cb":
                    recompute.append(engine.recompute_seconds)
            dt = time.perf_counter() - t0
            secs[name].append(dt)
            toks[name].append(n_tok / dt)
        same += "cb" in texts and texts["hf"] == texts["cb"]
    print(
        f"\n{label}: {len(prompt_sets[0])} responses, max_new_tokens {sampling.max_new_tokens}, temperature "
        f"{sampling.temperature}, top-p {sampling.top_p}; {reps} interleaved repetitions"
    )
    print(f"  {'engine':<10} {'s/call median [min-max]':<26} {'tokens/s median [min-max]':<28} time vs hf")
    hf = statistics.median(secs["hf"])
    for n in names:
        s, t = secs[n], toks[n]
        print(
            f"  {n:<10} {statistics.median(s):7.2f} [{min(s):.2f}-{max(s):.2f}]{'':<6} "
            f"{statistics.median(t):8.0f} [{min(t):.0f}-{max(t):.0f}]{'':<6} {statistics.median(s) / hf:5.2f}x"
        )
    if "cb" in names:
        print(
            f"  cb: of which behaviour log-prob recomputation {statistics.median(recompute):.2f} s (median); "
            f"hf and cb drew identical responses in {same}/{reps} repetitions"
        )
    if "vllm" in names:
        vllm_lines(engines["vllm"], model, tok, prompt_sets[0], sampling)
    if "cb-native" in names:
        print(native_contract_check(model, tok, prompt_sets[0], sampling, batch_check))


def vllm_lines(engine, model, tok, prompts, sampling):
    """One weight sync's cost, and vLLM's log-probs of its samples against the trainer's (the gap the
    training run logs as rollout/sampler_*)."""
    from vapo_lit.algos import sampler_mismatch

    prompts = prompts[:8]  # (the recomputation's logits: rows x tokens x vocabulary floats)
    engine.load_weights(model)
    ro = engine.generate(prompts, sampling, 12345)
    trainer = recomputed_logprobs(
        model,
        tok,
        prompts,
        [ro.response_ids[i, : int(n)].tolist() for i, n in enumerate(ro.lengths)],
        sampling.temperature,
    )
    gap = sampler_mismatch(trainer, ro.logprobs[ro.response_mask.bool()], torch.ones_like(trainer))
    print(
        f"  vllm: one load_weights {engine.sync_seconds * 1e3:.1f} ms; its log-probs vs the trainer's ({model.dtype}, "
        f"{trainer.numel()} sampled tokens): mean |diff| {gap.mean_abs:.2e}, max |diff| {gap.max_abs:.2e}, "
        f"approx KL {gap.approx_kl:.2e}"
    )


def llama_100m():
    """A 100M-class Llama with random weights and a synthetic word-level tokenizer of 32,000 words and
    4 special tokens (prompts of 16 words)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(32000)}
    vocab.update({"<pad>": 32000, "<s>": 32001, "</s>": 32002, "<unk>": 32003})
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        intermediate_size=2048,
        max_position_embeddings=2048,
        bos_token_id=32001,
        eos_token_id=32002,
        pad_token_id=32000,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = 32002
    return model, tok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 repetition, max_new_tokens 64")
    ap.add_argument(
        "--long", action="store_true", help="hf vs cb at 32 responses x 1,024 tokens, EOS suppressed"
    )
    ap.add_argument(
        "--vllm",
        action="store_true",
        help="add vllm (the vLLM-variant built-in policy; with --long a 100M-class Llama)",
    )
    ap.add_argument(
        "--engines", help="comma-separated subset of the engines to time (default: all of the mode's)"
    )
    ap.add_argument("--shape", default="32x1024", help="--vllm --long: responses x tokens (default 32x1024)")
    args = ap.parse_args(argv)
    reps = 1 if args.quick else args.reps
    torch.set_num_threads(1)
    cfg = merge(RunConfig(), PRESETS["default"])
    task = get_task(cfg.task)
    if args.vllm:
        return main_vllm(args, cfg, task, reps)
    model, tok = load_policy(cfg.model, task, seed=cfg.model_seed)
    max_new = 64 if args.quick else task.max_new_tokens
    k = cfg.vapo.samples_per_prompt if "group_sampling" in cfg.components else 1
    n_prompts = cfg.ppo.responses_per_step // k
    rollout_sets = [
        [p.prompt for p in task.train_problems(n_prompts, seed=rep) for _ in range(k)] for rep in range(reps)
    ]
    eval_prompts = [p.prompt for p in task.eval_problems()[: cfg.eval_problems] for _ in range(cfg.eval_k)]
    print(
        f"built-in SFT policy ({sum(p.numel() for p in model.parameters())} parameters, {model.dtype}), "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread; rollout = {n_prompts} prompts x {k} samples"
    )
    if args.long:
        import vapo_lit.engines.continuous as continuous
        import vapo_lit.engines.hf as hf

        hf.eos_ids_of = continuous.eos_ids_of = lambda model, tokenizer: [
            -1
        ]  # every response runs to the limit
        sets = [[p.prompt for p in task.train_problems(4, seed=rep) for _ in range(8)] for rep in range(reps)]
        run_shape(
            "rollout, long",
            model,
            tok,
            sets,
            SamplingParams(1024, temperature=1.0, top_p=1.0),
            reps,
            batch_check=False,
            names=("hf", "cb"),
        )
        return
    run_shape(
        "rollout",
        model,
        tok,
        rollout_sets,
        SamplingParams(max_new, temperature=cfg.ppo.temperature, top_p=cfg.ppo.top_p),
        reps,
        batch_check=True,
    )
    run_shape(
        "eval",
        model,
        tok,
        [eval_prompts] * reps,
        SamplingParams(max_new, temperature=cfg.eval_temperature, top_p=cfg.eval_top_p),
        reps,
        batch_check=False,
    )


def main_vllm(args, cfg, task, reps):
    names = tuple(args.engines.split(",")) if args.engines else ("hf", "cb", "vllm")
    import vapo_lit.engines.continuous as continuous
    import vapo_lit.engines.hf as hf
    import vapo_lit.engines.vllm as vllm_engine

    if args.long:
        model, tok = llama_100m()
        # every response runs to the limit: no token counts as EOS (vLLM: no stop token at all)
        hf.eos_ids_of = continuous.eos_ids_of = lambda model, tokenizer: [-1]
        vllm_engine.eos_ids_of = lambda model, tokenizer: []
        print(
            f"100M-class Llama, random weights ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
            f"{model.dtype}), torch {torch.__version__}, {torch.get_num_threads()} thread"
        )
        words = random.Random(0)
        n, length = (int(x) for x in args.shape.split("x"))
        sets = [
            [" ".join(f"w{words.randrange(32000)}" for _ in range(16)) for _ in range(n)] for _ in range(reps)
        ]
        run_shape(
            "rollout, long (100M Llama)",
            model,
            tok,
            sets,
            SamplingParams(length, temperature=1.0, top_p=1.0),
            reps,
            batch_check=False,
            names=names,
        )
        return
    from vapo_lit.models.builtin import vllm_model

    model, tok = load_policy(cfg.model, task, seed=cfg.model_seed, model_config=vllm_model(task))
    print(
        f"built-in SFT policy, vLLM variant ({sum(p.numel() for p in model.parameters())} parameters, one head of "
        f"64, {model.dtype}), torch {torch.__version__}, {torch.get_num_threads()} thread"
    )
    max_new = 64 if args.quick else task.max_new_tokens
    k = cfg.vapo.samples_per_prompt
    n_prompts = cfg.ppo.responses_per_step // k
    rollout_sets = [
        [p.prompt for p in task.train_problems(n_prompts, seed=rep) for _ in range(k)] for rep in range(reps)
    ]
    run_shape(
        "rollout",
        model,
        tok,
        rollout_sets,
        SamplingParams(max_new, temperature=cfg.ppo.temperature, top_p=cfg.ppo.top_p),
        reps,
        batch_check=False,
        names=names,
    )
    if args.long is False and not args.quick:
        eval_prompts = [
            p.prompt for p in task.eval_problems()[: cfg.eval_problems] for _ in range(cfg.eval_k)
        ]
        run_shape(
            "eval",
            model,
            tok,
            [eval_prompts] * reps,
            SamplingParams(max_new, temperature=cfg.eval_temperature, top_p=cfg.eval_top_p),
            reps,
            batch_check=False,
            names=names,
        )


if __name__ == "__main__":
    main()
