"""The built-in task "chain": a self-contained countdown chain with a sparse 0/1 outcome reward.

Prompt (word tokens)::

    chain <x0> from <n>:

The correct response counts down ``k = n, n-1, ..., 1`` writing ``k: v_k`` with
``v_k = (v_{k+1} + k) mod 10`` (``v_{n+1} = x0``), then ``=> v_1`` and EOS::

    37: 4 36: 0 35: 5 ... 1: 3 => 3

Every counter ``"k:"`` and every digit is one token, so a correct response is ``2n + 3`` tokens
(EOS included): n = 4 .. 110 gives 11 .. 223 tokens, the range where VAPO's length-adaptive
lambda matters (lambda = 0 below 20 tokens at alpha = 0.05, >= 0.9 at 200). Each step needs only
the previous value and the counter the response itself just wrote, so a tiny transformer can
learn it; an error, once written, is visible in the prefix (the critic has something to learn).

Verifier: reward 1 iff the response has exactly the chain structure (n steps, counters n..1 in
order, one digit per step, ``=>`` and one digit, nothing else) *and* the final answer equals the
ground truth. ``Verdict.strict`` is the independent check: additionally every intermediate value
is right (a right final answer after a wrong chain shows up as reward 1 / strict False). With
``reward="chain"`` the reward is the strict check itself (the long preset: on a chain of hundreds of
steps, wrong values that happen to cancel mod 10 land on the right answer about one time in ten).
The verifier only splits the text on whitespace and compares strings; it never executes anything.

Imperfect demonstrations (:class:`DemoConfig`, used to SFT the base policy): the demonstrator is
exact except on "hard" steps (``k % hard_period == hard_residue``, i.e. adding 0 mod 10 with the
defaults), where it writes ``correct + error_offset`` with probability ``error_prob``; the chain
then continues consistently from the written value. The error is concentrated on ~1 step in 10
with a large probability on purpose: evaluation samples with top-p 0.7, which would remove a
small per-step error probability altogether.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import asdict, dataclass
from functools import cached_property

from vapo_lit.tasks import register
from vapo_lit.tasks.base import Problem, Task, Verdict

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
ARROW = "=>"
_MAX_CHARS = 1_000_000  # longer responses are wrong by definition (not a verifier error)


@dataclass(frozen=True)
class ChainTaskConfig:
    """Shape of the built-in chain task (the defaults are the tuned ones)."""

    min_n: int = 4
    """Fewest chain steps (shortest correct response = 2 * min_n + 3 tokens)."""
    max_n: int = 110
    """Most chain steps (longest correct response = 2 * max_n + 3 tokens)."""
    n_buckets: int = 4
    """Number of equal-width difficulty buckets over n (reported per bucket at evaluation)."""
    eval_fraction: float = 0.25
    """Share of the (x0, n) prompt space reserved for evaluation (hash split, disjoint from train)."""
    eval_per_bucket: int = 48
    """Evaluation problems per bucket (taken from the reserved eval prompts, fixed order)."""
    max_new_tokens: int = 0
    """Response-length limit; 0 means 2 * max_n + 8 (a little slack past the longest answer)."""
    add_counter: bool = False
    """Step rule v_k = (v_{k+1} + add_const + (k if add_counter else 0)) mod 10; see add_const."""
    add_const: int = 3
    """Constant added each step (3 makes the value cycle through all ten digits)."""
    n_sampling: str = "uniform"
    """How training prompts draw n: uniform (every (x0, n) pair alike) or log (log-uniform n, so
    10-100 steps are as likely as 100-1000: a wide length distribution whose long tail stays
    affordable; the long preset)."""
    bucket_spacing: str = "linear"
    """Difficulty buckets over n: equal width (linear) or equal ratio (log: the long preset)."""
    reward: str = "answer"
    """What earns reward 1: the final answer (answer; a wrong chain can still land on it) or every
    step of the chain (chain: the answer only counts with its derivation; the long preset)."""


@dataclass(frozen=True)
class DemoConfig:
    """The imperfect demonstrator whose samples SFT the base policy."""

    hard_period: int = 10
    """A step is hard when k % hard_period == hard_residue (one step in hard_period)."""
    hard_residue: int = 0
    """See hard_period; with 0 the hard step adds 0 mod 10 (value unchanged)."""
    error_prob: float = 0.4
    """Probability of writing the wrong value on a hard step (> 0.3 so top-p 0.7 keeps it)."""
    error_offset: int = 1
    """The wrong value written is (correct + error_offset) mod 10 (-3 would repeat the previous
    value; measured, it gave a critic no more to go on than +1)."""


def step_value(v_prev: int, k: int, *, add_counter: bool, add_const: int) -> int:
    """The correct value written after counter k, given the previous value."""
    return (v_prev + add_const + (k if add_counter else 0)) % 10


def chain_values(x0: int, n: int, *, add_counter: bool = False, add_const: int = 3) -> list[int]:
    """The correct values v_n, ..., v_1."""
    out, v = [], x0
    for k in range(n, 0, -1):
        v = step_value(v, k, add_counter=add_counter, add_const=add_const)
        out.append(v)
    return out


N_SAMPLING = ("uniform", "log")
BUCKET_SPACING = ("linear", "log")
REWARDS = ("answer", "chain")


def bucket_edges(min_n: int, max_n: int, n_buckets: int, spacing: str = "linear") -> list[int]:
    """The first n of each bucket, then max_n + 1: equal widths, or (log) equal ratios."""
    if spacing == "linear":
        width = (max_n - min_n + 1) / n_buckets
        edges = [min_n + round(i * width) for i in range(n_buckets)]
    else:
        edges = [round(min_n * ((max_n + 1) / min_n) ** (i / n_buckets)) for i in range(n_buckets)]
    edges.append(max_n + 1)
    if any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(
            f"n_buckets={n_buckets} is too many for n in [{min_n}, {max_n}] with {spacing} spacing "
            "(a bucket would be empty)"
        )
    return edges


def _split_is_eval(x0: int, n: int, fraction: float) -> bool:
    h = hashlib.sha256(f"vapo-lit/chain/split/{x0}/{n}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64 < fraction


@register("chain")
class ChainTask(Task):
    name = "chain"
    version = "1"

    def __init__(self, config: ChainTaskConfig | None = None, **overrides):
        cfg = config or ChainTaskConfig()
        if overrides:
            cfg = ChainTaskConfig(**{**asdict(cfg), **overrides})
        if not (1 <= cfg.min_n <= cfg.max_n):
            raise ValueError(f"need 1 <= min_n <= max_n, got {cfg.min_n}, {cfg.max_n}")
        if cfg.n_buckets < 1 or cfg.n_buckets > cfg.max_n - cfg.min_n + 1:
            raise ValueError(f"n_buckets must be in [1, max_n - min_n + 1], got {cfg.n_buckets}")
        for key, valid in (
            ("n_sampling", N_SAMPLING),
            ("bucket_spacing", BUCKET_SPACING),
            ("reward", REWARDS),
        ):
            if getattr(cfg, key) not in valid:
                raise ValueError(
                    f"{key}={getattr(cfg, key)!r} is not valid; choose one of: {', '.join(valid)}"
                )
        self.config = cfg
        self.max_new_tokens = cfg.max_new_tokens or 2 * cfg.max_n + 8
        self._edges = bucket_edges(cfg.min_n, cfg.max_n, cfg.n_buckets, cfg.bucket_spacing)
        digits = max(3, len(str(2 * cfg.max_n + 3)))
        self._bucket_names = [
            f"len{2 * lo + 3:0{digits}d}-{2 * (hi - 1) + 3:0{digits}d}"
            for lo, hi in zip(self._edges, self._edges[1:])
        ]
        pairs = [(x0, n) for n in range(cfg.min_n, cfg.max_n + 1) for x0 in range(10)]
        self._eval_pairs = [p for p in pairs if _split_is_eval(*p, cfg.eval_fraction)]
        self._train_pairs = [p for p in pairs if not _split_is_eval(*p, cfg.eval_fraction)]
        if not self._train_pairs or not self._eval_pairs:
            raise ValueError("eval_fraction leaves no train or no eval prompts")
        self._train_x0 = {}  # n -> the x0 of its train prompts (log sampling draws n first)
        for x0, n in self._train_pairs:
            self._train_x0.setdefault(n, []).append(x0)

    # ---------------------------------------------------------------- tokenizer
    def vocab(self) -> list[str]:
        return (
            [PAD, BOS, EOS, UNK, "chain", "from", ARROW]
            + [str(d) for d in range(10)]
            + [f"{k}:" for k in range(1, self.config.max_n + 1)]
        )

    @cached_property
    def tokenizer(self):
        return build_tokenizer(self.vocab())

    # ---------------------------------------------------------------- problems
    def values(self, x0: int, n: int) -> list[int]:
        """The correct chain values v_n, ..., v_1 under this task's rule."""
        return chain_values(x0, n, add_counter=self.config.add_counter, add_const=self.config.add_const)

    def make_problem(self, x0: int, n: int) -> Problem:
        vals = self.values(x0, n)
        return Problem(
            prompt=f"chain {x0} from {n}:",
            answer=str(vals[-1]),
            meta={"x0": x0, "n": n, "bucket": self._bucket_of_n(n)},
        )

    def _bucket_of_n(self, n: int) -> str:
        for name, lo, hi in zip(self._bucket_names, self._edges, self._edges[1:]):
            if lo <= n < hi:
                return name
        raise ValueError(f"n={n} outside [{self.config.min_n}, {self.config.max_n}]")

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        """`n` problems from the train prompt space (difficulty mixed): uniform over its (x0, n)
        pairs, or with `n_sampling="log"` n log-uniform (then x0 uniform among n's train prompts)."""
        rng = random.Random(f"vapo-lit/chain/train/{seed}")
        if self.config.n_sampling == "uniform":
            return [self.make_problem(*rng.choice(self._train_pairs)) for _ in range(n)]
        return [self.make_problem(*self._log_pair(rng)) for _ in range(n)]

    def _log_pair(self, rng: random.Random) -> tuple[int, int]:
        """(x0, n) with P(n) proportional to log((n + 1/2) / (n - 1/2)), about 1/n."""
        lo, hi = math.log(self.config.min_n - 0.5), math.log(self.config.max_n + 0.5)
        while True:
            n = min(self.config.max_n, max(self.config.min_n, round(math.exp(rng.uniform(lo, hi)))))
            if n in self._train_x0:  # (every x0 of an n may be an eval prompt: draw again)
                return rng.choice(self._train_x0[n]), n

    def eval_problems(self) -> list[Problem]:
        """`eval_per_bucket` reserved prompts per bucket, ordered by bucket then by hash."""
        out = []
        for name in self._bucket_names:
            pairs = [p for p in self._eval_pairs if self._bucket_of_n(p[1]) == name]
            pairs.sort(key=lambda p: hashlib.sha256(f"order/{p}".encode()).digest())
            out += [self.make_problem(*p) for p in pairs[: self.config.eval_per_bucket]]
        return out

    def is_eval_prompt(self, x0: int, n: int) -> bool:
        return _split_is_eval(x0, n, self.config.eval_fraction)

    def bucket(self, problem: Problem) -> str:
        return self._bucket_of_n(int(problem.meta["n"]))

    def bucket_names(self) -> list[str]:
        return list(self._bucket_names)

    # ---------------------------------------------------------------- verifier
    def verify(self, problem: Problem, response: str) -> Verdict:
        try:
            return self._verify(problem, response)
        except Exception as e:  # noqa: BLE001 - a verifier failure is reported, never raised
            return Verdict(0.0, error=f"{type(e).__name__}: {e}")

    def _verify(self, problem: Problem, response: str) -> Verdict:
        x0, n = int(problem.meta["x0"]), int(problem.meta["n"])
        if not isinstance(response, str) or len(response) > _MAX_CHARS:
            return Verdict(0.0, strict=False)
        toks = response.split()
        if len(toks) != 2 * n + 2:
            return Verdict(0.0, strict=False)
        digits = set("0123456789")
        values = []
        for i, k in enumerate(range(n, 0, -1)):
            if toks[2 * i] != f"{k}:" or toks[2 * i + 1] not in digits:
                return Verdict(0.0, strict=False)
            values.append(int(toks[2 * i + 1]))
        if toks[-2] != ARROW or toks[-1] not in digits:
            return Verdict(0.0, strict=False)
        ok = toks[-1] == problem.answer
        strict = ok and values == self.values(x0, n)
        return Verdict(1.0 if (strict if self.config.reward == "chain" else ok) else 0.0, strict=strict)

    # ---------------------------------------------------------------- oracle values
    ORACLE_KINDS = ("counter", *(f"digit{d}" for d in range(10)), "arrow", "answer", "eos")
    """Kinds of target position the oracle measures an error rate for: the counters "k:", the value
    written at step k by k mod 10 (the demonstrator errs on k mod 10 == 0), "=>", the answer, EOS."""

    @property
    def has_oracle(self) -> bool:
        """True state values exist where exactly one response wins: reward "chain" (every step right)."""
        from vapo_lit.tasks.env import is_environment

        return self.config.reward == "chain" and not is_environment(self)

    def oracle_targets(self, problems: list[Problem]):
        """(target ids (N, L) long, position kinds (N, L) long, target lengths (N,) long): the one
        winning response of each problem as token ids, EOS included, right-padded with -1."""
        import torch

        ids = {w: i for i, w in enumerate(self.vocab())}
        kind = {k: i for i, k in enumerate(self.ORACLE_KINDS)}
        rows, kinds = [], []
        for p in problems:
            x0, n = int(p.meta["x0"]), int(p.meta["n"])
            row, kk = [], []
            for k, v in zip(range(n, 0, -1), self.values(x0, n)):
                row += [ids[f"{k}:"], ids[str(v)]]
                kk += [kind["counter"], kind[f"digit{k % 10}"]]
            rows.append(row + [ids[ARROW], ids[p.answer], ids[EOS]])
            kinds.append(kk + [kind["arrow"], kind["answer"], kind["eos"]])
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
        width = int(lengths.max()) if rows else 0
        pad = lambda rs: torch.tensor([r + [-1] * (width - len(r)) for r in rs], dtype=torch.long)  # noqa: E731
        return pad(rows), pad(kinds), lengths

    def oracle_values(self, problems: list[Problem], response_ids, lengths):
        """(`V*`, error rates): the success probability from every response state under the policy
        that wrote these responses (vapo_lit.algos.oracle), its per-kind error rates measured on the
        same responses; `V*` is (N, R) float64, 0 on padding and after a response left its target."""
        from vapo_lit import algos

        if not self.has_oracle:
            raise ValueError(
                f"task {self.name!r} has no oracle values with reward={self.config.reward!r}; "
                "they exist with reward='chain' (the longchain task)"
            )
        target, kinds, target_lengths = self.oracle_targets(problems)
        dev = response_ids.device
        target, kinds, target_lengths = target.to(dev), kinds.to(dev), target_lengths.to(dev)
        first = algos.first_mismatch(response_ids, lengths, target, target_lengths)
        rates, trials, _ = algos.kind_error_rates(
            first, lengths, kinds, target_lengths, len(self.ORACLE_KINDS)
        )
        values = algos.target_success_values(
            first, lengths, kinds, target_lengths, rates, response_ids.shape[1]
        )
        return values, {k: float(r) for k, r, t in zip(self.ORACLE_KINDS, rates, trials) if t > 0}

    # ---------------------------------------------------------------- demonstrations
    def demonstration(self, problem: Problem, demo: DemoConfig, rng: random.Random) -> str:
        """One imperfect demonstration (see :class:`DemoConfig`)."""
        x0, n = int(problem.meta["x0"]), int(problem.meta["n"])
        v, parts = x0, []
        for k in range(n, 0, -1):
            v = step_value(v, k, add_counter=self.config.add_counter, add_const=self.config.add_const)
            if k % demo.hard_period == demo.hard_residue and rng.random() < demo.error_prob:
                v = (v + demo.error_offset) % 10
            parts += [f"{k}:", str(v)]
        parts += [ARROW, str(v)]
        return " ".join(parts)

    def solution(self, problem: Problem) -> str:
        """The correct response text."""
        x0, n = int(problem.meta["x0"]), int(problem.meta["n"])
        parts = []
        for k, v in zip(range(n, 0, -1), self.values(x0, n)):
            parts += [f"{k}:", str(v)]
        return " ".join(parts + [ARROW, problem.answer])


def build_tokenizer(vocab: list[str]):
    """A word-level `PreTrainedTokenizerFast` (whitespace split) that prepends <bos>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    ids = {w: i for i, w in enumerate(vocab)}
    tok = Tokenizer(models.WordLevel(vocab=ids, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, ids[BOS])]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )
