"""Answer extraction, equivalence, the no-execution proof for math-verify, and the timeout path."""

from __future__ import annotations

import builtins
import re
import sys
import threading
import time
from fractions import Fraction

import pytest

from vapo_lit.tasks import answers as A
from vapo_lit.tasks.answers import (
    CheckerPool,
    cas_equal,
    cas_safe,
    check_answer,
    check_batch,
    extract_answer,
    extract_boxed,
    normalize,
    parse_number,
    reference_answer,
)


@pytest.fixture(scope="module")
def pool():
    p = CheckerPool(size=2)
    yield p
    p.close()


def ok(gold, response, pool, **kw):
    v = check_answer(gold, response, pool=pool, timeout=kw.pop("timeout", 10.0), **kw)
    assert v.error is None, v
    return v.reward


# ------------------------------------------------------------------------------- extraction
@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so the result is \boxed{42}.", "42"),
        (r"\boxed{1} then, correcting myself, \boxed{2}", "2"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\fbox{7}", "7"),
        (r"\boxed 5 is it", "5"),
        (r"\boxed{3} and then a truncated \boxed{\frac{1}{", "3"),  # last complete one
        ("Natalia sold 48/2 = 24 clips.\n#### 72", "72"),
        ("#### 1,000.\nmore text", "1,000"),
        ("Thus the final answer is $\\frac{3}{4}$.", r"\frac{3}{4}"),
        ("The answer is 12. I am sure.", "12"),
        ("The answer is 3.5", "3.5"),
        ("Answer: **17**", "17"),
        (" 42\n", "42"),
        ("", None),
        ("</s>", None),
        ("<|endoftext|><|endoftext|>", None),
        ("#### 7<|im_end|>", "7"),
        (" 42</s>", "42"),
        ("I am not sure what to say here, it depends on many factors really", None),
        (r"\boxed{", None),
        (r"\boxed{}", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_boxed_ignores_escaped_braces_and_other_commands():
    assert extract_boxed(r"\boxed{\{ x \}}") == r"\{ x \}"
    assert extract_boxed(r"\boxedfoo{1}") is None


@pytest.mark.parametrize(
    "field, expected",
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7"),
        ("#### 1,234", "1,234"),
        (r"The area is \boxed{\frac{\sqrt{3}}{4}}.", r"\frac{\sqrt{3}}{4}"),
        ("  -5 ", "-5"),
        (r"\frac{1}{2}", r"\frac{1}{2}"),
    ],
)
def test_reference_answer(field, expected):
    assert reference_answer(field) == expected


def test_normalize_and_numbers():
    assert normalize(r"\$ 1{,}000 .") == normalize(r"1{,}000")
    assert normalize(r"\left( 1, 2 \right)") == "(1,2)"
    assert normalize(r"\dfrac{1}{2}") == normalize(r"\frac{1}{2}")
    assert parse_number("1,000") == (Fraction(1000), False)
    assert parse_number("-0.25") == (Fraction(-1, 4), False)
    assert parse_number(r"\frac{3}{4}") == (Fraction(3, 4), False)
    assert parse_number(r"-\dfrac{3}{4}") == (Fraction(-3, 4), False)
    assert parse_number("3/4") == (Fraction(3, 4), False)
    assert parse_number(r"50\%") == (Fraction(50), True)
    assert parse_number(r"\$18.00") == (Fraction(18), False)
    assert parse_number(r"5 \text{ cm}") == (Fraction(5), False)
    assert parse_number("1,00") is None  # not a thousands grouping
    assert parse_number("1/0") is None
    assert parse_number("9" * 100) is None  # too many digits for the in-process path
    assert parse_number("1e999999999") is None  # no exponent notation (unbounded cost)
    assert parse_number("x") is None
    assert parse_number("72 clips") == (Fraction(72), False)
    assert parse_number(r"\$18 dollars per day") == (Fraction(18), False)
    for not_a_unit in ("5 million", "72 or 73", "5 pi", "3 times", "10 apples and pears"):
        assert parse_number(not_a_unit) is None, not_a_unit


# ------------------------------------------------------------------------------- equivalence
@pytest.mark.parametrize(
    "gold, response",
    [
        ("42", r"\boxed{42}"),
        ("0.5", r"\boxed{\frac{1}{2}}"),
        (r"\frac{1}{2}", r"The answer is 0.5"),
        ("1000", "#### 1,000"),
        ("1,000", r"\boxed{1000}"),
        ("50", r"\boxed{50\%}"),
        ("0.5", r"\boxed{50\%}"),
        ("18", r"\boxed{\$18.00}"),
        ("72", r"\boxed{72 \text{ clips}}"),
        ("72", "The answer is 72 clips."),
        ("-3", r"\boxed{-3}"),
        ("72", "Natalia sold 48 + 24 = 72 clips.\n#### 72"),
        (r"\frac{\sqrt{2}}{2}", r"\boxed{\sqrt{2}/2}"),
        (r"\frac{\sqrt{2}}{2}", r"\boxed{\frac{1}{\sqrt{2}}}"),
        ("x+1", r"\boxed{1 + x}"),
        ("(1,2)", r"\boxed{(1, 2)}"),
        (r"\{1,2\}", r"\boxed{\{2, 1\}}"),
        (r"2\pi", r"\boxed{2 \pi}"),
    ],
)
def test_equivalent(gold, response, pool):
    assert ok(gold, response, pool) == 1.0


@pytest.mark.parametrize(
    "gold, response",
    [
        ("42", r"\boxed{41}"),
        ("0.5", r"\boxed{\frac{1}{3}}"),
        ("1000", "#### 100"),
        (r"\frac{\sqrt{2}}{2}", r"\boxed{\sqrt{2}}"),
        ("x+1", r"\boxed{x - 1}"),
        ("(1,2)", r"\boxed{(2, 1)}"),
        (r"\frac{1}{3}", r"\boxed{0.333}"),  # numeric comparison is exact
        ("72", r"\boxed{72 \text{ or } 73}"),  # hedges
        ("72", r"\boxed{72, 73}"),
        ("72", "The answer is 72 or 73."),
        ("5", r"\boxed{5 \pi}"),
        ("5", "The answer is 5 million."),
    ],
)
def test_not_equivalent(gold, response, pool):
    assert ok(gold, response, pool) == 0.0


def test_right_number_in_the_wrong_place(pool):
    resp = "We need 42 apples as the question says. Counting again gives \\boxed{41}."
    assert ok("42", resp, pool) == 0.0
    # restating the answer before a different #### answer
    assert ok("42", "Is it 42? No.\n#### 40", pool) == 0.0


def test_answer_buried_in_junk(pool):
    junk = "qz#@!" * 2000
    assert ok("42", junk + r" so \boxed{42} " + junk, pool) == 1.0
    assert ok("42", junk + " 42 " + junk, pool) == 0.0  # no final-answer marker


@pytest.mark.parametrize(
    "response",
    [
        "",
        "</s>",
        "<|endoftext|>",
        "<|im_end|>" * 50,
        "\x00\x01\x02\ufffd",
        "}}}}{{{{",
        r"\boxed{{{{{",
        r"\boxed{" * 5000,
        "}" * 100_000 + r"\boxed{" * 1000,
        "#" * 10_000,
        "answer is " * 10_000,
        "9" * 5000,
        r"\boxed{" + "9" * 5000 + "}",
        r"\boxed{" + "(" * 3000 + "}",
        r"\boxed{\frac{}{}}",
        r"\boxed{\sqrt}",
        r"\boxed{\\\\}",
        r"\boxed{$$}",
        "\\" * 1000,
        None,
        12345,
    ],
)
def test_adversarial_never_raises(response, pool):
    v = check_answer("42", response, pool=pool, timeout=5.0)
    assert v.reward == 0.0
    assert v.error is None or v.error.startswith(("timeout:", "exception:"))


def test_one_megabyte_response(pool):
    text = ("lorem ipsum 17 dolor sit amet " * 40_000)[:1_000_000]
    t0 = time.perf_counter()
    assert check_answer("42", text, pool=pool).reward == 0.0
    assert check_answer("42", text + r" \boxed{42}", pool=pool).reward == 1.0
    # a super-linear extraction on 1 MB runs for minutes; the bound only has to tell that apart from a
    # linear pass (~0.5 s idle) on a loaded 2-core machine (5 s failed at load average 10)
    assert time.perf_counter() - t0 < 30.0


def test_check_batch_matches_single(pool):
    golds = ["42", "0.5", r"\frac{\sqrt{2}}{2}", "x+1", "7"]
    resps = [r"\boxed{42}", r"\boxed{\frac{1}{2}}", r"\boxed{\sqrt{2}/2}", r"\boxed{x-1}", ""]
    got = check_batch(golds, resps, pool=pool)
    assert [v.reward for v in got] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert all(v.error is None for v in got)


# ------------------------------------------------------------------------------- no execution
PAYLOADS = [
    "__import__('os').system('touch {marker}')",
    '__import__("os").system("touch {marker}")',
    "(lambda: __import__('os').system('touch {marker}'))()",
    "().__class__.__base__.__subclasses__()",
    "open('{marker}', 'w').write('x')",
    "exec(\"open('{marker}','w')\")",
    "eval(\"__import__('os').system('touch {marker}')\")",
    "compile('1', 'x', 'exec')",
    "globals()['__builtins__']",
    "1+1; __import__('os').system('touch {marker}')",
    "Symbol('x').__class__.__init__.__globals__",
    "lambda x: x",
    "import os",
    "sys.exit(3)",
    "os.system('touch {marker}')",
    "Integer(1).__reduce__()",
    "x.__dict__",
    "__import__os",
]


def _payload_responses(marker: str) -> list[str]:
    out = []
    for p in PAYLOADS:
        p = p.format(marker=marker)
        out += [
            p,
            "\\boxed{" + p + "}",
            "#### " + p,
            "The answer is " + p,
            "The final answer is " + p,
            "$" + p + "$",
            "\\boxed{\\text{" + p + "}}",
            "\\boxed{\\operatorname{" + p + "}}",
            "\\boxed{\\mathrm{" + p + "}(1)}",
        ]
    return out


def test_payloads_through_the_verifier_execute_nothing(pool, tmp_path):
    marker = tmp_path / "pwned_verifier"
    resps = _payload_responses(str(marker))
    verdicts = check_batch(["42"] * len(resps), resps, pool=pool, timeout=10.0)
    assert all(v.reward == 0.0 for v in verdicts)
    assert all(v.error is None for v in verdicts), [v.error for v in verdicts if v.error]
    assert not marker.exists()
    # what passes the whitelist in front of math-verify has no quote, backtick or dunder (and the
    # LaTeX path it reaches evaluates nothing: see the next test)
    passed = [a for a in (A._cas_prepare(extract_answer(r) or "") for r in resps) if cas_safe(a)]
    assert passed and not any(c in a for a in passed for c in ("'", '"', "`", "__"))


class _Tripwire:
    """Replaces builtins.eval/exec (what parse_expr and sympify(str) end in) and records calls."""

    ALLOWED_EXEC_CALLERS = frozenset({"sympy.polys.monomials"})

    def __init__(self, monkeypatch):
        self.calls: list[tuple[str, str]] = []
        real_eval, real_exec = builtins.eval, builtins.exec

        def fake(name, real):
            def f(*args, **kwargs):
                src = args[0] if args else None
                caller = sys._getframe(1).f_globals.get("__name__", "?")
                # importlib runs module code objects (real files) with exec: that is not model text
                from_file = hasattr(src, "co_filename") and not src.co_filename.startswith("<")
                # sympy's polynomial code builds monomial helpers from its own template, keyed
                # only by the number of generators (an int), and caches them
                codegen = name == "exec" and caller in self.ALLOWED_EXEC_CALLERS
                if not from_file and not codegen:
                    self.calls.append((name, repr(src)[:100]))
                return real(*args, **kwargs)

            return f

        monkeypatch.setattr(builtins, "eval", fake("eval", real_eval))
        monkeypatch.setattr(builtins, "exec", fake("exec", real_exec))
        import sympy.parsing.sympy_parser as sp
        import math_verify.parser as mvp

        real_parse_expr = sp.parse_expr
        monkeypatch.setattr(sp, "parse_expr", fake("parse_expr", real_parse_expr))
        monkeypatch.setattr(mvp, "parse_expr", fake("parse_expr", real_parse_expr))
        mvp.parse_expr_cached.cache_clear()
        mvp.parse_latex_cached.cache_clear()
        mvp.extract_latex.cache_clear()
        from sympy.core.cache import clear_cache

        clear_cache()


def test_latex_path_of_math_verify_calls_no_eval(monkeypatch, tmp_path):
    """The proof: the exact function the workers run (`cas_equal`), in-process, with eval/exec/
    parse_expr replaced by tripwires, over payloads (bypassing our whitelist) and ordinary answers."""
    marker = tmp_path / "pwned_latex"
    answers = [p.format(marker=marker) for p in PAYLOADS]
    answers += [
        r"\frac{\sqrt{2}}{2}",
        r"\sqrt{2}/2",
        "x+1",
        "1+x",
        "(1,2)",
        r"\{1,2\}",
        "0.5",
        r"50\%",
        "x=5",
        r"x \le 3",
        r"\sin(x)^2 + \cos(x)^2",
        r"\begin{pmatrix}1\\2\end{pmatrix}",
        r"\operatorname{foo}(x)",
        r"\mathrm{eval}(1)",
        r"\text{import os}",
        r"2^{10}",
        "1,000",
    ]

    def run_all():
        for ans in answers:
            for gold in ("42", ans):
                try:
                    cas_equal(gold, ans)
                except Exception:  # noqa: BLE001  (an exception is allowed; execution is not)
                    pass

    run_all()  # warm-up: sympy/mpmath generate some of their own code with exec at import time
    tw = _Tripwire(monkeypatch)  # clears math-verify's parse caches, so everything is re-parsed
    run_all()
    assert tw.calls == [], tw.calls
    assert not marker.exists()


def test_default_math_verify_config_does_reach_parse_expr(monkeypatch, tmp_path):
    """Why we use the LaTeX path only: math-verify's default `parse` (with ExprExtractionConfig)
    hands a regex-filtered substring of the response to sympy's parse_expr, i.e. to eval."""
    from math_verify import parse

    marker = tmp_path / "pwned_default"
    texts = ["The final answer is 3*7+13"]
    for p in PAYLOADS:
        texts += [p.format(marker=marker), "The answer is " + p.format(marker=marker)]
    for t in texts:  # warm-up (imports)
        parse(t)
    tw = _Tripwire(monkeypatch)
    for t in texts:
        parse(t)
    exprs = [arg for name, arg in tw.calls if name == "parse_expr"]
    assert exprs, tw.calls
    # the regex in front of it keeps letters and quotes out, so even the default path ran nothing:
    assert not marker.exists()
    assert all(re.fullmatch(r"'[0-9\s.+\-*/()×÷]*'", a) for a in exprs), exprs


def test_latex_number_tokens_are_numeric_literals_and_built_without_eval():
    """latex2sympy builds numbers with sympy.Number(token) (sympify -> eval); its lexer only lets
    numeric literals into those tokens, and we build them directly anyway (`_harden_latex2sympy`)."""
    import random

    from antlr4 import InputStream
    from latex2sympy2_extended.antlr_parser import PSLexer

    kinds = {PSLexer.NUMBER, PSLexer.E_NOTATION, PSLexer.PERCENT_NUMBER}
    rnd = random.Random(0)
    alphabet = "0123456789" * 4 + ".,eE+-%\\{}()xa'\"_*^/ "
    texts = [p for p in PAYLOADS] + [
        "".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 12))) for _ in range(3000)
    ]
    for t in texts:
        lex = PSLexer(InputStream(t))
        lex.removeErrorListeners()
        try:
            toks = lex.getAllTokens()
        except Exception:  # noqa: BLE001
            continue
        for tok in toks:
            if tok.type in kinds:
                assert re.fullmatch(r"[0-9.,E+\-%\\ ]+", tok.text), tok.text

    A._harden_latex2sympy()
    import latex2sympy2_extended.latex2sympy2 as l2s

    assert l2s._Latex2Sympy.parse_number.__module__ == A.__name__
    assert l2s.convert_number.__module__ == A.__name__
    assert A._literal_number("0042") == 42 and float(A._literal_number("2.5E3")) == 2500.0
    for bad in ("x", "1+1", "__import__('os')", "1e", ""):
        with pytest.raises(ValueError):
            A._literal_number(bad)


def test_unhardened_latex2sympy_evals_only_numeric_literals(monkeypatch, tmp_path):
    """The finding behind `_harden_latex2sympy`: with latex2sympy's own number constructors, the
    LaTeX path does call parse_expr (eval), but only on numeric-literal tokens."""
    import latex2sympy2_extended.latex2sympy2 as l2s

    cas_equal("1", "1")  # hardened and warm
    monkeypatch.setattr(l2s._Latex2Sympy, "parse_number", A._ORIGINALS["parse_number"])
    monkeypatch.setattr(l2s, "convert_number", A._ORIGINALS["convert_number"])
    marker = tmp_path / "pwned_unhardened"
    answers = [p.format(marker=marker) for p in PAYLOADS] + ["42", "1,000", r"2.5E3", r"50\%", r"\frac{1}{2}"]
    tw = _Tripwire(monkeypatch)
    for ans in answers:
        try:
            cas_equal("7", ans)
        except Exception:  # noqa: BLE001
            pass
    exprs = [arg for name, arg in tw.calls if name == "parse_expr"]
    assert exprs  # the unhardened path does reach parse_expr ...
    assert all(re.fullmatch(r"'[0-9.E+\-]+'", a) for a in exprs), exprs  # ... on numbers only
    assert not marker.exists()


@pytest.mark.parametrize(
    "ans, safe",
    [
        (r"\frac{\sqrt{2}}{2}", True),
        ("x+1", True),
        (r"\{1, 2\}", True),
        (r"(-\infty, 3]", True),
        (r"50\%", True),
        (r"\text{east}", True),
        ("__import__", False),
        ("a'b", False),
        ('"x"', False),
        ("`x`", False),
        ("x@y", False),
        (r"\input{/etc/passwd}", False),
        (r"\def\x{1}", False),
        (r"\frac{1}{2", False),
        ("}{", False),
        ("1" * 1000, False),
        ("", False),
        ("x#y", False),
    ],
)
def test_cas_whitelist(ans, safe):
    assert cas_safe(ans) is safe


# ------------------------------------------------------------------------------- timeouts, failures
@pytest.mark.parametrize("pathological", [r"\boxed{9^{9^{9^{9}}}}", r"\boxed{10^{-10^{10}}}"])
def test_timeout_is_a_verifier_error(pathological):
    p = CheckerPool(size=1)
    try:
        check_answer("1", r"\boxed{1}", pool=p)  # worker started and warm
        t0 = time.perf_counter()
        v = check_answer("1", pathological, pool=p, timeout=1.0)
        elapsed = time.perf_counter() - t0
        assert v.reward == 0.0 and v.error is not None and v.error.startswith("timeout:"), v
        # unguarded, this check never ends: the bound tells 'deadline enforced' from 'hung', with room
        # for a loaded machine (4 s failed at load average 10)
        assert elapsed < 20.0, elapsed
        assert p.timeouts == 1
        # the pool recovers: a fresh worker answers the next call
        assert check_answer("0.5", r"\boxed{\frac{2}{4}+0}", pool=p, timeout=10.0) == A.Verdict(1.0)
    finally:
        p.close()


def test_timeout_in_a_batch_does_not_spoil_the_others():
    p = CheckerPool(size=2)
    try:
        golds = ["x+1", "1", r"\frac{\sqrt{2}}{2}", "2x"]
        resps = [r"\boxed{1+x}", r"\boxed{9^{9^{9^{9}}}}", r"\boxed{\sqrt{2}/2}", r"\boxed{x+x}"]
        t0 = time.perf_counter()
        got = check_batch(golds, resps, pool=p, timeout=1.5)
        assert time.perf_counter() - t0 < 25.0  # not hung on the pathological one (see above)
        assert [v.reward for v in got] == [1.0, 0.0, 1.0, 1.0]
        assert [bool(v.error) for v in got] == [False, True, False, False]
        assert got[1].error.startswith("timeout:")
    finally:
        p.close()


def test_works_off_the_main_thread(pool):
    """math-verify's own signal-based timeout raises ValueError outside the main thread."""
    out = {}
    th = threading.Thread(
        target=lambda: out.update(
            v=check_answer(r"\frac{\sqrt{2}}{2}", r"\boxed{\sqrt{2}/2}", pool=pool, timeout=10.0)
        )
    )
    th.start()
    th.join(30)
    assert out["v"] == A.Verdict(1.0)


def test_worker_killed_mid_check_is_an_exception_error():
    p = CheckerPool(size=1)
    try:
        check_answer("1", r"\boxed{x}", pool=p)
        proc = p._workers[0].proc
        threading.Timer(0.5, proc.kill).start()
        t0 = time.perf_counter()
        v = check_answer("1", r"\boxed{9^{9^{9^{9}}}}", pool=p, timeout=20.0)
        assert time.perf_counter() - t0 < 15.0  # the kill is noticed, not the 20 s deadline waited out
        assert v.reward == 0.0 and v.error.startswith("exception:"), v
        assert check_answer("x+1", r"\boxed{1+x}", pool=p, timeout=10.0) == A.Verdict(1.0)
    finally:
        p.close()


def test_worker_that_cannot_start_gives_errors_not_hangs():
    p = CheckerPool(size=1, mem_limit_bytes=8 << 20)  # too little memory to import sympy
    try:
        v = check_answer("x+1", r"\boxed{1+x}", pool=p)
        assert v.reward == 0.0 and v.error.startswith("exception:") and "start" in v.error, v
        # answers settled in-process still get their verdicts
        assert check_answer("42", r"\boxed{42}", pool=p) == A.Verdict(1.0)
    finally:
        p.close()


def test_extraction_bug_is_an_error_not_a_wrong_answer(monkeypatch):
    def boom(text):
        raise RuntimeError("bug")

    monkeypatch.setattr(A, "extract_answer", boom)
    v = check_answer("42", r"\boxed{42}")
    assert v.reward == 0.0 and v.error.startswith("exception:")


def test_worker_stops_itself_when_nobody_kills_it():
    """Backstop for a dead parent: the worker's per-job RLIMIT_CPU ends a runaway check."""
    import json
    import subprocess

    p = subprocess.Popen(
        [sys.executable, "-c", "from vapo_lit.tasks.answers import _worker_main; _worker_main()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert json.loads(p.stdout.readline()) == {"ready": True}
        p.stdin.write((json.dumps({"gold": "1", "pred": "9^{9^{9^{9}}}", "timeout": 0.5}) + "\n").encode())
        p.stdin.flush()
        assert p.wait(timeout=30) != 0  # killed by SIGXCPU a few CPU-seconds later
    finally:
        p.kill()
        p.wait()


def test_forked_child_gets_its_own_workers(pool):
    import os

    assert check_answer("x+1", r"\boxed{1+x}", pool=pool) == A.Verdict(1.0)  # parent's workers up
    pid = os.fork()
    if pid == 0:  # child: must not talk to the parent's workers
        code = 1
        try:
            v = check_answer(r"\frac{\sqrt{2}}{2}", r"\boxed{\sqrt{2}/2}", pool=pool, timeout=20.0)
            code = 0 if v == A.Verdict(1.0) else 2
            pool.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert check_answer("2x", r"\boxed{x+x}", pool=pool) == A.Verdict(1.0)  # parent still fine
