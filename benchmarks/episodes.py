"""Multi-turn episodes with long tool observations, in one run, same model, same environment:
- `hf-1tok`: the `hf` episode loop feeding each observation through the KV cache one token per step,
  beside the other rows' sampled tokens (`obs_chunk=1`);
- `hf`: the same loop feeding a row's action and its whole observation in one forward pass;
- `vllm`: each round resubmits the episode; vLLM's prefix cache reuses the K/V and prefills an
  observation in one pass.

    python benchmarks/episodes.py                       # 8 episodes, 200-token observations, 2 reps
    python benchmarks/episodes.py --obs 50 --reps 3
    python benchmarks/episodes.py --engines hf-1tok,hf  # without vLLM (the Makefile's .venv)

The environment answers every turn (ending at "?" or EOS) with `--obs` tokens until the token budget
ends the episode. The policy is a random Llama of the environment's 65-word vocabulary in a shape
vLLM's CPU backend runs (hidden 256, 4 layers, 4 heads of 64; float32) with near-uniform outputs, so
a turn is about 32 sampled tokens: episodes of several observations within the 1,024-token budget.
`hf` and `hf-1tok` sample the same episodes (the script says whether their tokens are identical);
vLLM draws from its own random stream, so its episodes are not hf's: the table prints per engine
the seconds per call, the sampled (action) and observation tokens, and action tokens per second;
the ratios are seconds over `hf`'s. vLLM's start-up and first weight push happen before the timings (printed apart).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import torch

from vapo_lit.engines import SamplingParams, make_engine
from vapo_lit.engines.episodes import EpisodeEngine
from vapo_lit.rng import sample_seed
from vapo_lit.tasks.base import Problem, Verdict
from vapo_lit.tasks.chain import build_tokenizer
from vapo_lit.tasks.env import Environment, Tool

WORDS = (
    [
        "<pad>",
        "<bos>",
        "<eos>",
        "<unk>",
        "task",
        "call",
        "read",
        "?",
        "error",
        "malformed",
        "unknown",
        "tool",
        "bad",
        "args",
        "failed",
    ]
    + [f"w{i}" for i in range(40)]
    + [str(d) for d in range(10)]
)


class LongObservations(Environment):
    """Every call is answered with `obs` tokens (the digits repeated): a file, a page, a trace."""

    name, version, max_turns = "long-observations", "1", 1000
    stop_sequences = ("?",)

    def __init__(self, obs: int, budget: int):
        self.max_new_tokens = budget
        self._tok = build_tokenizer(WORDS)
        text = " ".join(str(i % 10) for i in range(obs))
        self.tools = {"read": Tool("read", lambda problem, args: text, "a long observation")}

    @property
    def tokenizer(self):
        return self._tok

    def respond(self, problem, transcript, turn, *, turns_done, final):
        from vapo_lit.tasks.env import EnvStep

        return EnvStep(observation=self.tools["read"].fn(problem, []))  # every turn reads, until the budget

    def problem_from_prompt(self, prompt):
        return Problem(prompt, "0", {})

    def train_problems(self, n, seed):
        return [Problem(f"task w{(seed + i) % 40}", "0", {}) for i in range(n)]

    def eval_problems(self):
        return self.train_problems(8, 0)

    def verify(self, problem, response):
        return Verdict(0.0)


def policy(tok, seed: int = 0):
    """A random Llama (vLLM's CPU backend runs its head size 64) with near-uniform next-token
    distributions."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok),
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=2048,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            tie_word_embeddings=False,
        )
    ).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(0.01)
    return model


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--obs", type=int, default=200, help="tokens per observation")
    ap.add_argument("--budget", type=int, default=1024, help="max_new_tokens: actions and observations")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument(
        "--engines", default="hf-1tok,hf,vllm" if importlib.util.find_spec("vllm") else "hf-1tok,hf"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    env = LongObservations(args.obs, args.budget)
    tok = env.tokenizer
    model = policy(tok)
    prompts = [p.prompt for p in env.train_problems(args.episodes, 0)]
    sampling = SamplingParams(max_new_tokens=args.budget)
    engines = {}
    for name in args.engines.split(","):
        t0 = time.perf_counter()
        engines[name] = (
            EpisodeEngine(model, tok, env, obs_chunk=1)
            if name == "hf-1tok"
            else make_engine(name, model, tok, task=env)
        )
        engines[name].generate(prompts[:1], SamplingParams(max_new_tokens=8), [0])  # start-up, first push
        print(f"{name}: start-up {time.perf_counter() - t0:.1f} s")
    times = {name: [] for name in engines}
    counts, last = {}, {}
    for rep in range(args.reps):
        seeds = [sample_seed(100 + rep, i) for i in range(len(prompts))]
        for name in list(engines)[rep % len(engines) :] + list(engines)[: rep % len(engines)]:
            t0 = time.perf_counter()
            ro = engines[name].generate(prompts, sampling, seeds)
            times[name].append(time.perf_counter() - t0)
            actions = int(ro.action_mask.sum())
            counts[name] = (actions, int(ro.response_mask.sum()) - actions, int(ro.turns.sum()))
            last[name] = ro
    print(
        f"\n{args.episodes} episodes, observations of {args.obs} tokens, budget {args.budget}, "
        f"{args.reps} reps (median [min-max]); tokens of the last rep"
    )
    print(f"{'engine':<6} {'s/call':>20} {'actions':>8} {'obs tokens':>11} {'turns':>6} {'actions/s':>10}")
    for name, ts in times.items():
        a, o, t = counts[name]
        med = statistics.median(ts)
        print(f"{name:<6} {med:8.2f} [{min(ts):.2f}-{max(ts):.2f}] {a:>8} {o:>11} {t:>6} {a / med:>10.1f}")
    if "hf" in times:
        for name in (n for n in times if n != "hf"):
            print(
                f"{name} / hf seconds per call: {statistics.median(times[name]) / statistics.median(times['hf']):.2f}"
            )
    if "hf" in last and "hf-1tok" in last:
        same = torch.equal(last["hf"].response_ids, last["hf-1tok"].response_ids)
        gap = float((last["hf"].logprobs - last["hf-1tok"].logprobs).abs().max()) if same else float("nan")
        print(
            f"hf and hf-1tok episodes: tokens {'identical' if same else 'DIFFER'}, max |delta log p| {gap:.2e}"
        )


if __name__ == "__main__":
    main()
