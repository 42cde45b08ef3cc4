"""What only a GPU can confirm, in one command: under 10 minutes on one H200.

    python benchmarks/gpu_check.py --out gpu_check.json      # on a CUDA machine
    python benchmarks/gpu_check.py --cpu --out cpu.json      # every check that needs no CUDA, reduced shapes, ~1 min

One line per check (pass / fail / skip, its figure), all of them written as JSON to --out. Checks:

* collectives: our collective helpers on a one-rank NCCL group (a CPU tensor must reach NCCL on the
  GPU, results come back on the caller's device); --cpu: the same on gloo;
* train_ddp, train_fsdp: a tiny vapo-train run with --strategy ddp / fsdp on one device (its own
  process each): finite losses, non-zero gradient norms;
* gpu_smoke: benchmarks/gpu_smoke.py (0.5B, bf16-mixed; --cpu: its tiny shape): seconds per
  iteration, tokens/s, peak memory, and the first update's ratio / KL / clip fractions;
* autocast_value_head: the critic's values under bf16 autocast: float32, and not rounded to bf16
  (the fraction of values bf16 holds exactly; an fp32 head gives almost none), distance from fp32;
* autocast_logprobs: behaviour log-probs of 256 sampled responses under bf16 autocast against the
  update's recomputation (the first mini-batch's ratio);
* cb_engine: the continuous-batching engine: every Rollout tensor on the model's device, the same
  responses as hf;
* decode_gqa: hf-engine decode tokens/s and peak memory for a 7:1 GQA shape (128 rows, 2k context;
  --cpu: 8 rows, 128);
* logprob_pass: the update's log-prob pass (forward + backward) at 4 x 4k tokens x 152k vocabulary
  with and without logits chunks (--cpu: 2 x 256 x 32k): peak memory of each, largest difference.

A failed check does not stop the others; the exit status is 1 when any failed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402


def result(status: str, figure: str, **data) -> dict:
    return {"status": status, "figure": figure, **data}


def skip_without_cuda(cpu: bool):
    return result("skip", "skip (no CUDA)") if not cpu and not torch.cuda.is_available() else None


def device_of(cpu: bool) -> torch.device:
    return torch.device("cpu") if cpu else torch.device("cuda", torch.cuda.current_device())


def peak_reset(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    return 0


def peak_gb(device, base=0) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def qwen(vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, mlp: int, device, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=mlp,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    with torch.device(device):
        return Qwen2ForCausalLM(cfg).eval()


# ----------------------------------------------------------------------------- checks
def check_collectives(cpu: bool) -> dict:
    """Our helpers on a one-rank group: NCCL (cuda) or gloo (--cpu). With one rank the helpers
    would return at once, so they are run as if the group had several (is_distributed patched)."""
    import torch.distributed as dist

    from vapo_lit import distributed as D
    from vapo_lit.experience import Experience

    if s := skip_without_cuda(cpu):
        return s
    backend = "gloo" if cpu else "nccl"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group(backend, rank=0, world_size=1)
    real = D.is_distributed
    D.is_distributed = lambda: True
    try:
        refused = "not tried"
        if not cpu:
            try:
                dist.all_reduce(torch.ones(1))
                refused = "accepted a CPU tensor"
            except Exception as e:  # noqa: BLE001 - we only record what NCCL said
                refused = str(e).splitlines()[0][:120]
        x = torch.tensor([1.5, 2.5], dtype=torch.float64)  # on the CPU, as module.py builds its sums
        s, m = D.all_reduce(x), D.all_reduce(x, "max")
        flag = D.agree_any(True)
        n, R = 2, 3
        exp = Experience(
            prompt_ids=torch.ones(n, 2, dtype=torch.long),
            prompt_mask=torch.ones(n, 2, dtype=torch.long),
            response_ids=torch.ones(n, R, dtype=torch.long),
            mask=torch.ones(n, R),
            behaviour_logprobs=torch.zeros(n, R),
            lengths=torch.full((n,), R),
            truncated=torch.zeros(n, dtype=torch.bool),
            problems=[0] * n,
            texts=["a"] * n,
            group_size=1,
        )
        whole = D.gather_experience(exp, pad_id=0)
        lin = torch.nn.Linear(2, 2)
        D.broadcast_module(lin)
        ok = (
            s.tolist() == [1.5, 2.5]
            and m.tolist() == [1.5, 2.5]
            and s.device.type == "cpu"
            and flag
            and whole.mask.shape == (n, R)
            and whole.mask.device.type == "cpu"
        )
        return result(
            "pass" if ok else "fail",
            f"{backend}: device types {D.group_device_types()}, raw CPU tensor: {refused}",
            device_types=list(D.group_device_types()),
        )
    finally:
        D.is_distributed = real
        dist.destroy_process_group()


def _train_config(out: str, strategy: str, cpu: bool):
    from gpu_smoke import SHAPES

    from vapo_lit.config import COMPONENTS, RunConfig, merge

    shape = SHAPES["tiny"]
    return shape, merge(
        RunConfig(),
        {
            "components": list(COMPONENTS),
            "ppo": shape["ppo"],
            "steps": 2,
            "eval_every": 0,
            "eval_k": 1,
            "eval_problems": 2,
            "accelerator": "cpu" if cpu else "cuda",
            "devices": "1",
            "strategy": strategy,
            "precision": "32-true" if cpu else "bf16-mixed",
            "wandb": "disabled",
            "out_dir": out,
            "cache_dir": out,
            "name": f"train_{strategy}",
            "threads": 1 if cpu else None,
            "vapo": {"samples_per_prompt": shape["samples_per_prompt"], "value_pretrain_steps": 1},
        },
    )


def train_child(strategy: str, cpu: bool) -> dict:
    """One tiny run with `strategy` on one device (run in its own process: each run makes its own
    process group)."""
    import csv

    from gpu_smoke import build

    from vapo_lit.module import VapoModule
    from vapo_lit.train import train

    with tempfile.TemporaryDirectory() as out:
        shape, cfg = _train_config(out, strategy, cpu)
        task, actor, critic = build(shape)
        t0 = time.perf_counter()
        summary = train(cfg, module_factory=lambda c: VapoModule(c, task, actor, task.tokenizer, critic))
        wall = time.perf_counter() - t0
        rows = list(csv.DictReader(open(Path(summary["run_dir"]) / "metrics.csv")))
    last = [r for r in rows if r.get("policy/grad_norm")][-1]
    loss, gnorm, vnorm = (float(last[k]) for k in ("loss/policy", "policy/grad_norm", "value/grad_norm"))
    ok = summary["ppo_updates"] == 2 and math.isfinite(loss) and gnorm > 0 and vnorm > 0
    return result(
        "pass" if ok else "fail",
        f"{strategy} on {cfg.accelerator}: {wall:.1f} s, loss/policy {loss:.4g}, "
        f"grad norms actor {gnorm:.3g} critic {vnorm:.3g}",
        seconds=wall,
        ppo_updates=summary["ppo_updates"],
    )


def start_train(strategy: str, cpu: bool, skip: dict | None):
    if skip:
        return skip
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_train", strategy] + (["--cpu"] if cpu else [])
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MASTER_PORT": str(29600 + (strategy == "fsdp") + os.getpid() % 500),
    }
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish_train(proc, timeout: float) -> dict:
    if isinstance(proc, dict):
        return proc
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return result("fail", f"timed out after {timeout:.0f} s")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return result(
            "fail", f"exit {proc.returncode}: {err.strip().splitlines()[-1] if err.strip() else ''}"
        )
    return json.loads(lines[-1])


def check_gpu_smoke(cpu: bool) -> dict:
    import csv

    import gpu_smoke

    if s := skip_without_cuda(cpu):
        return s
    with tempfile.TemporaryDirectory() as out:
        with contextlib.redirect_stdout(io.StringIO()):  # its own JSON: kept in this check's record
            # two PPO iterations after the pretraining one (gpu_smoke's default is three): the figures are
            # per iteration, and the whole script must stay within 10 minutes on one GPU
            r = gpu_smoke.main(["--shape", "tiny" if cpu else "0.5b", "--iterations", "2", "--out", out])
        rows = [
            x
            for x in csv.DictReader(open(Path(out) / "gpu_smoke" / "metrics.csv"))
            if x.get("policy/ratio_mean")
        ]
    first = rows[0]
    keys = (
        "policy/ratio_mean",
        "policy/ratio_max",
        "policy/approx_kl",
        "policy/clipfrac_low",
        "policy/clipfrac_high",
        "policy/grad_norm",
        "value/grad_norm",
    )
    update = {k: float(first[k]) for k in keys}
    ok = (
        update["policy/grad_norm"] > 0
        and update["value/grad_norm"] > 0
        and all(map(math.isfinite, update.values()))
    )
    peak = r["peak_gpu_memory_gb"]
    return result(
        "pass" if ok else "fail",
        f"{r['shape']}: {sum(r['seconds_per_iteration']) / len(r['seconds_per_iteration']):.1f} s/iteration, "
        f"{max(r['generated_tokens_per_second']):.0f} tokens/s, peak {peak if peak is None else round(peak, 1)} GB, "
        f"first update ratio {update['policy/ratio_mean']:.4f} (max {update['policy/ratio_max']:.3f}) "
        f"kl {update['policy/approx_kl']:.2e}",
        smoke=r,
        first_update=update,
    )


def _small_llm(cpu: bool, device, vocab: int | None = None):
    return qwen(
        vocab or (512 if cpu else 32_000),
        64 if cpu else 896,
        2,
        4 if cpu else 14,
        2 if cpu else 2,
        128 if cpu else 4864,
        device,
    )


def check_autocast_value_head(cpu: bool) -> dict:
    from vapo_lit.models.value import ValueModel

    device = device_of(cpu)
    critic = ValueModel.from_causal_lm(_small_llm(cpu, device)).eval()
    ids = torch.randint(3, 500, (8, 64), device=device)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        full = critic(ids, mask)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            mixed = critic(ids, mask)
    diff = float((mixed.double() - full.double()).abs().max())
    # a head computed in bf16 and upcast gives values that bf16 holds exactly; an fp32 head almost never does
    rounded = float((mixed == mixed.bfloat16().float()).float().mean())
    ok = mixed.dtype == torch.float32 and rounded < 0.5
    return result(
        "pass" if ok else "fail",
        f"values under bf16 autocast: {mixed.dtype}, {rounded:.0%} of them bf16-rounded, "
        f"max |V - V_fp32| {diff:.2e}",
        dtype=str(mixed.dtype),
        bf16_rounded_frac=rounded,
        max_abs_diff=diff,
    )


def check_autocast_logprobs(cpu: bool) -> dict:
    """256 responses sampled under bf16 autocast (as Lightning's bf16-mixed runs the rollout);
    their behaviour log-probs against the update's recomputation (passes.response_logprobs)."""
    from synthetic import word_tokenizer

    from vapo_lit import passes
    from vapo_lit.engines import SamplingParams, make_engine

    device = device_of(cpu)
    vocab = 512 if cpu else 32_000
    model, tok = _small_llm(cpu, device, vocab), word_tokenizer(vocab)
    n, new = (64, 8) if cpu else (256, 64)
    prompts = [" ".join(f"w{(i * 7 + j) % 400}" for j in range(16)) for i in range(n)]
    engine = make_engine("hf", model, tok)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        ro = engine.generate(prompts, SamplingParams(max_new_tokens=new), 0)
        with torch.no_grad():
            lp = passes.response_logprobs(
                model,
                ro.input_ids,
                ro.attention_mask,
                ro.prompt_ids.shape[1],
                ro.response_ids,
                temperature=1.0,
            )[0]
    m = ro.response_mask.bool()
    d = (ro.logprobs.double() - lp.double())[m].abs()
    ratio = float((ro.logprobs.double() - lp.double())[m].exp().sub(1).abs().max())
    ok = ratio < 0.05
    return result(
        "pass" if ok else "fail",
        f"{n} responses: behaviour vs recomputed log-probs max |diff| {float(d.max()):.2e} "
        f"(mean {float(d.mean()):.2e}), max |ratio - 1| {ratio:.3f}",
        responses=n,
        max_abs_diff=float(d.max()),
        mean_abs_diff=float(d.mean()),
        max_ratio_dev=ratio,
    )


def check_cb_engine(cpu: bool) -> dict:
    import dataclasses

    from synthetic import word_tokenizer

    from vapo_lit.engines import SamplingParams, make_engine
    from vapo_lit.engines.continuous import unavailable

    why = unavailable()
    if why:  # an optional engine (transformers' continuous batching): its absence is not a failure
        return result("skip", f"skip ({why.splitlines()[0][:300]})")
    device = device_of(cpu)
    vocab = 512 if cpu else 32_000
    model, tok = _small_llm(cpu, device, vocab), word_tokenizer(vocab)
    prompts = [" ".join(f"w{(i * 5 + j) % 300}" for j in range(8 + i % 5)) for i in range(16)]
    s = SamplingParams(max_new_tokens=12)
    a = make_engine("cb", model, tok).generate(prompts, s, 3)
    b = make_engine("hf", model, tok).generate(prompts, s, 3)
    tensors = {
        f.name: getattr(a, f.name)
        for f in dataclasses.fields(a)
        if isinstance(getattr(a, f.name), torch.Tensor)
    }
    off = [k for k, v in tensors.items() if v.device != device]
    same = a.texts == b.texts
    diff = float((a.logprobs.double() - b.logprobs.double()).abs().max())
    ok = not off and same and diff < 1e-3
    return result(
        "pass" if ok else "fail",
        f"cb on {device}: fields off the model's device {off or 'none'}, "
        f"same responses as hf {same}, max |logprob diff| {diff:.1e}",
        off_device=off,
        same_responses=same,
    )


def check_decode_gqa(cpu: bool) -> dict:
    from synthetic import word_tokenizer

    from vapo_lit.engines.hf import generate

    device = device_of(cpu)
    # 7:1 grouped-query attention (Qwen2.5-7B's 28 query / 4 K/V heads of 128; 2 layers here)
    vocab, hidden, heads, kv, mlp, rows, prompt, new = (
        (4096, 224, 7, 1, 448, 8, 96, 32) if cpu else (152_064, 3584, 28, 4, 18944, 128, 1536, 512)
    )
    model = qwen(vocab, hidden, 2, heads, kv, mlp, device).to(torch.float32 if cpu else torch.bfloat16)
    tok = word_tokenizer(vocab)
    prompts = [" ".join(f"w{(i * 13 + j) % (vocab - 8)}" for j in range(prompt - 1)) for i in range(rows)]
    model.generation_config.eos_token_id = None
    base = peak_reset(device)
    t0 = time.perf_counter()
    ro = generate(model, tok, prompts, max_new_tokens=new, seeds=0)
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    tokens = int(ro.lengths.sum())
    peak = peak_gb(device, base)
    return result(
        "pass" if tokens > 0 else "fail",
        f"{rows} rows x {prompt}+{new} tokens, 7:1 GQA: "
        f"{tokens / wall:.0f} tokens/s, peak {'n/a' if peak is None else f'{peak:.2f} GB'} above the weights",
        tokens_per_second=tokens / wall,
        peak_gb=peak,
        rows=rows,
        context=prompt + new,
    )


def check_logprob_pass(cpu: bool) -> dict:
    from vapo_lit import passes

    device = device_of(cpu)
    vocab, n, T, chunk = (32_000, 2, 256, 64) if cpu else (152_064, 4, 4096, 512)
    model = qwen(vocab, 64 if cpu else 896, 1, 4 if cpu else 14, 2, 128 if cpu else 4864, device)
    ids = torch.randint(3, vocab, (n, T), device=device)
    mask = torch.ones_like(ids)
    P = 16
    out = {}
    for label, c in (("unchunked", None), ("chunked", chunk)):
        model.zero_grad(set_to_none=True)
        base = peak_reset(device)
        ctx = (
            torch.autocast("cuda", dtype=torch.bfloat16)
            if device.type == "cuda"
            else torch.autocast("cpu", enabled=False)
        )
        with ctx:
            lp = passes.response_logprobs(model, ids, mask, P, ids[:, P:], temperature=1.0, chunk=c)[0]
        lp.sum().backward()
        out[label] = (lp.detach().double(), peak_gb(device, base))
        del lp
    diff = float((out["chunked"][0] - out["unchunked"][0]).abs().max())
    peaks = {k: v[1] for k, v in out.items()}
    ok = diff < (1e-4 if cpu else 5e-2)
    fig = ", ".join(f"{k} peak {'n/a' if v is None else f'{v:.1f} GB'}" for k, v in peaks.items())
    return result(
        "pass" if ok else "fail",
        f"{n} x {T} tokens x {vocab} vocab: {fig}, max |diff| {diff:.1e}",
        peak_gb=peaks,
        max_abs_diff=diff,
    )


CHECKS = {
    "collectives": check_collectives,
    "gpu_smoke": check_gpu_smoke,
    "autocast_value_head": check_autocast_value_head,
    "autocast_logprobs": check_autocast_logprobs,
    "cb_engine": check_cb_engine,
    "decode_gqa": check_decode_gqa,
    "logprob_pass": check_logprob_pass,
}
ORDER = ("collectives", "train_ddp", "train_fsdp", *[k for k in CHECKS if k != "collectives"])
NEEDS_CUDA = ("cb_engine", "decode_gqa", "logprob_pass", "autocast_value_head", "autocast_logprobs")
"""Checks whose point is a CUDA measurement; under --cpu they run at reduced shapes on the CPU."""


def run(name: str, fn, cpu: bool) -> dict:
    t0 = time.perf_counter()
    try:
        if not cpu and not torch.cuda.is_available():
            r = result("skip", "skip (no CUDA)")
        else:
            r = fn(cpu)
    except Exception as e:  # noqa: BLE001 - one failed check must not hide the others
        r = result(
            "fail", f"{type(e).__name__}: {e}".splitlines()[0][:300], traceback=traceback.format_exc()[-2000:]
        )
    r["seconds"] = round(time.perf_counter() - t0, 2)
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--cpu", action="store_true", help="run every check that needs no CUDA, on the CPU at reduced shapes"
    )
    ap.add_argument("--out", help="write the results here as JSON")
    ap.add_argument("--only", help="comma-separated check names (default: all)")
    ap.add_argument("--_train", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._train:
        print(json.dumps(train_child(args._train, args.cpu)))
        return 0
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)) if args.cpu else torch.get_num_threads())
    only = set(args.only.split(",")) if args.only else set(ORDER)
    unknown = only - set(ORDER)
    if unknown:
        raise SystemExit(f"unknown check(s) {sorted(unknown)}; valid: {', '.join(ORDER)}")
    no_cuda = None if args.cpu or torch.cuda.is_available() else result("skip", "skip (no CUDA)")
    t0 = time.perf_counter()
    procs = {
        k: start_train(k.split("_")[1], args.cpu, no_cuda) for k in ("train_ddp", "train_fsdp") if k in only
    }
    results = {}
    for name in ORDER:
        if name not in only:
            continue
        if name in procs:
            r = finish_train(procs[name], timeout=240 if args.cpu else 300)
            r.setdefault("seconds", round(time.perf_counter() - t0, 2))
        else:
            r = run(name, CHECKS[name], args.cpu)
        r["device"] = (
            "cpu" if args.cpu else (torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
        )
        results[name] = r
        print(f"{name:20s} {r['status']:4s}  {r['figure']}", flush=True)
    report = {
        "cpu": args.cpu,
        "torch": torch.__version__,
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "checks": results,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    return 1 if any(r["status"] == "fail" for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
