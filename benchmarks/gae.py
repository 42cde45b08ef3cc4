"""GAE speed, side by side in one run: the reverse Python loop over T that verl/OpenRLHF/TRL use
(scalar lambda), the same loop with one lambda per sequence, vapo-lit's `gae` (native C sweep; and
its pure-torch fallback), and the memory-bandwidth floor of one ideal pass.

    python benchmarks/gae.py            # (64,512), (256,2048), (512,8192), float32, 2 threads
    python benchmarks/gae.py --quick    # small shapes, a few seconds

Ratios are loop time / vapo-lit time (higher = we are faster). The floor is the bytes one ideal
pass must move (read rewards, values, mask; write advantages, returns: 20 bytes per element in
float32) divided by the copy bandwidth measured here with torch's copy_ on a 256 MiB buffer.
Each row of the batch gets a random length (right padding) and a reward on its last token; the
result of every method is checked against a float64 loop (max normwise relative error printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from vapo_lit.algos import _native, gae
from vapo_lit.algos import advantage as adv_mod


def loop_gae(rewards, values, mask, lam, gamma=1.0):
    """The common reverse loop over T, written here from the GAE definition: one (B,) step per
    token; masked positions carry the running advantage and next value through unchanged."""
    B, T = rewards.shape
    adv = torch.zeros_like(rewards)
    running = torch.zeros(B, dtype=rewards.dtype)
    next_value = torch.zeros(B, dtype=rewards.dtype)
    for t in range(T - 1, -1, -1):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = m * (delta + gamma * lam * running) + (1 - m) * running
        next_value = m * values[:, t] + (1 - m) * next_value
        adv[:, t] = running * m
    return adv, (adv + values) * mask


def make_batch(B, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(T // 8 + 1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    values = torch.rand(B, T, generator=g) * mask
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), lengths - 1] = (torch.rand(B, generator=g) < 0.3).float()
    lam = (1 - 1 / (0.05 * lengths.double())).clamp(0, 1).float()
    return rewards, values, mask, lam


def median_time(fn, reps, warmup=1):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(reps=10):
    src = torch.ones(64 * 1024 * 1024)  # 256 MiB float32
    dst = torch.empty_like(src)
    t = median_time(lambda: dst.copy_(src), reps)
    return 2 * src.numel() * 4 / t  # bytes read + written per second


def rel_err(x, ref):
    return ((x.double() - ref).abs().max() / ref.abs().max().clamp(min=1e-12)).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small shapes and few repeats (a smoke run)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shapes = [(64, 512), (256, 2048)] if args.quick else [(64, 512), (256, 2048), (512, 8192)]
    loop_reps = 3 if args.quick else 5

    lib = _native.load()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32; "
        f"native kernel: {'loaded' if lib else 'unavailable: ' + str(_native.failure())}"
    )
    bw = copy_bandwidth()
    print(f"copy bandwidth (read + write): {bw / 1e9:.1f} GB/s\n")
    header = f"{'B x T':>12} {'method':<34} {'median ms':>10} {'loop/ours':>10} {'rel err':>9}"
    print(header)
    print("-" * len(header))
    for B, T in shapes:
        r, v, m, lam = make_batch(B, T)
        ref_adv, ref_ret = loop_gae(r.double(), v.double(), m.double(), lam.double())
        results = {}
        rows = [
            ("python loop, scalar lambda (peers)", lambda: loop_gae(r, v, m, 0.95), loop_reps, None),
            ("python loop, (B,) lambda", lambda: loop_gae(r, v, m, lam), loop_reps, ref_adv),
            (
                "vapo-lit gae (native)" if lib else "vapo-lit gae (torch: no kernel)",
                lambda: gae(r, v, m, lam),
                30,
                ref_adv,
            ),
            (
                "vapo-lit pure-torch fallback",
                lambda: adv_mod._sweep_torch(r, v, m, None, lam, None, 1.0),
                5 if T > 4096 else 10,
                ref_adv,
            ),
        ]
        for name, fn, reps, ref in rows:
            results[name] = median_time(fn, reps)
            err = rel_err(fn()[0], ref) if ref is not None else float("nan")
            results[name + "/err"] = err
        ours = results[rows[2][0]]
        for name, *_ in rows:
            ratio = results[name] / ours
            err = results[name + "/err"]
            print(
                f"{B:>5} x {T:<5} {name:<34} {results[name] * 1e3:>10.2f} {ratio:>9.1f}x "
                f"{'' if err != err else f'{err:.1e}':>9}"
            )
        floor = B * T * 20 / bw
        print(
            f"{B:>5} x {T:<5} {'bandwidth floor (20 B/elem)':<34} {floor * 1e3:>10.2f} "
            f"{floor / ours:>9.2f}x  (ours / floor = {ours / floor:.1f})"
        )
        if lib is not None:  # where the rest of gae()'s time goes: first-touch of fresh output pages
            adv, ret, bad = (torch.empty_like(r), torch.empty_like(r), torch.empty(B, dtype=torch.int64))

            def kern():
                lib.vapo_gae_f32(
                    r.data_ptr(),
                    v.data_ptr(),
                    m.data_ptr(),
                    None,
                    lam.data_ptr(),
                    None,
                    adv.data_ptr(),
                    ret.data_ptr(),
                    bad.data_ptr(),
                    B,
                    T,
                    1.0,
                )

            t_k = median_time(kern, 30)
            print(f"{B:>5} x {T:<5} {'  C sweep alone, 1 thread, outputs reused':<34} {t_k * 1e3:>10.2f}")
        ret_err = rel_err(gae(r, v, m, lam)[1], ref_ret)
        print(f"{'':>13} returns rel err vs float64 loop: {ret_err:.1e}\n")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    main()
