"""Final-answer extraction and safe equivalence checking for math tasks.

Pipeline for one response (see `check_answer` / `check_batch`):

1. **Extraction** (`extract_answer`, in-process, pure string scanning, linear time): the last
   ``\\boxed{...}`` / ``\\fbox{...}`` with balanced braces, else the text after the last ``####``,
   else what follows the last "answer is" / "answer:", else the whole response when it is a single
   short line. Nothing extracted -> reward 0 (a wrong answer, not a verifier error).
2. **Exact match** of the normalised strings (`normalize`), in-process.
3. **Numeric equivalence** (`parse_number`, in-process, exact `Fraction` arithmetic on at most
   `MAX_NUMBER_DIGITS` digits, no exponent notation, so it is bounded): integers, decimals, comma
   thousands (``1,000``), ``a/b``, ``\\frac{a}{b}``, percentages (``50\\%`` equals ``50`` and
   ``0.5``), currency signs, ``\\text{...}`` units and up to three trailing unit words (``72
   clips``; not value-changing words such as ``million``, ``pi``, ``or``) stripped. When both sides
   are plain numbers the numeric comparison is final (exact, no rounding: ``0.333`` is not ``1/3``).
4. **Symbolic equivalence** with HF's math-verify (``parse`` + ``verify``), run in a separate
   worker process under a per-call deadline (see "Timeout" below).

Safety finding (math-verify 0.9.0, latex2sympy2_extended 1.11.0, sympy 1.14; sources read in the
venv, grep for eval/exec/parse_expr/sympify/getattr; `tests/test_answers.py` checks it):

* ``math_verify.parser.extract_expr`` (the ``ExprExtractionConfig`` target, part of the *default*
  extraction config of ``parse``) calls ``sympy.parse_expr`` -- ``eval`` underneath -- on a
  substring of the response. A regex restricts that substring to digits, ``.``, whitespace and
  ``+-*/^()×÷``, so no name, attribute or string literal reaches it (a test confirms it over
  injection payloads), but it is still ``eval`` of model text, which a verifier must never run.
  **Decision: we never use ``ExprExtractionConfig``**; math-verify only gets
  ``LatexExtractionConfig``.
* The LaTeX path (``latex2sympy``) is an ANTLR grammar whose visitor builds sympy objects directly
  (``Symbol(name)``, ``Function(name)``, ``getattr`` only on fixed lists of trig/hyperbolic/min/max
  names); the ``sympify`` calls in ``sets.FiniteSet`` / ``logic.And`` see already-built sympy
  objects; its ``parse_expr`` in ``_Latex2Sympy.__init__`` is only for the caller's
  ``variable_values`` (math-verify passes none); ``math_verify.grader`` has no eval/exec/sympify on
  strings. **One exception**, found by the tripwire test: numbers are built with
  ``sympy.Number(token_text)`` (``_Latex2Sympy.parse_number`` and ``convert_number``), which is
  ``sympify(str)`` -> ``parse_expr`` -> ``eval``. The token comes from the lexer's NUMBER /
  E_NOTATION / PERCENT_NUMBER rules, which (fuzzed in a test) only hold digits, ``.``, ``,``,
  ``E``, ``+``, ``-``, ``%``, so it is not exploitable; still, **we replace those two functions**
  (`_harden_latex2sympy`, applied in `cas_equal`) by `_literal_number`, which builds the same
  ``Integer``/``Float`` directly and rejects anything but a numeric literal. With that, the path
  we use performs no eval/exec of any text derived from the response.
* Defence in depth: math-verify never sees the raw response, only our extracted answer, and only
  if it passes `cas_safe` -- at most `MAX_CAS_CHARS` characters, balanced braces, a character
  whitelist (no quotes, backticks, ``@``, ``#``, ``$``, ``__``) and a whitelist of LaTeX commands.
  An answer that fails the whitelist is scored 0 (wrong), not an error.
* The proof (tests): `cas_equal` run in-process with ``builtins.eval``/``exec`` and
  ``parse_expr`` replaced by recording tripwires, over code-injection payloads (bypassing the
  whitelist) and ordinary answers, records no call (import-time code objects and sympy's own
  monomial code generator, keyed by an int, are not model text and are not counted); payload
  responses through the full verifier create no file and raise nothing.

Timeout: math-verify's own timeout (``math_verify.utils.timeout``) is ``signal.alarm``: whole
seconds only, only in the main thread (``ValueError`` elsewhere, e.g. in a dataloader or callback
thread), it replaces any SIGALRM handler of the host program while it runs, a handler can only run
between bytecodes (C code that never checks for signals is not interrupted), and without
``raise_on_error`` a timeout becomes ``False`` -- a silent wrong answer. We disable it (``parsing_timeout=None, timeout_seconds=None``,
``raise_on_error=True``) and instead run math-verify in a small pool of persistent worker
*processes* (`CheckerPool`, ``python -c`` subprocesses speaking JSON lines over pipes, so no
pickling, no fork of a process holding torch threads, no re-import of ``__main__``). The parent
waits on each call with ``poll`` until its deadline; a worker past its deadline is killed
(SIGKILL) and replaced lazily, and the call returns ``Verdict(0.0, error="timeout: ...")``. A worker
exception returns ``error="exception: ..."``. Backstops inside the worker: ``RLIMIT_CPU`` raised per
job to (CPU used + deadline + 2 s), so a worker whose parent died cannot spin forever, and
``RLIMIT_AS`` (default 4 GiB) so a runaway allocation becomes a ``MemoryError`` (an error verdict).
Workers exit on EOF of their stdin (parent gone). Works from any thread (a lock serialises calls).
"""

from __future__ import annotations

import atexit
import json
import math
import os
import re
import select
import subprocess
import sys
import threading
import time
import weakref
from fractions import Fraction
from typing import Sequence

from vapo_lit.tasks.base import Verdict

MAX_ANSWER_CHARS = 1000
"""An extracted answer longer than this is cut (it can then only match by being wrong)."""
MAX_CAS_CHARS = 400
"""Answers longer than this never reach the CAS."""
MAX_NUMBER_DIGITS = 60
"""Numbers with more digits than this are not parsed in-process (they go to the CAS, if safe)."""
DEFAULT_TIMEOUT_S = 5.0
_MAX_BOXED_TRIES = 50
_MAX_BOXED_SCAN = 20_000

# ------------------------------------------------------------------------------------------------
# Extraction
# ------------------------------------------------------------------------------------------------

_BOXED_CMDS = ("\\boxed", "\\fbox")


def _balanced_from(text: str, open_idx: int) -> str | None:
    """Content of the brace group opening at `text[open_idx] == '{'`, or None if unbalanced."""
    depth = 0
    i = open_idx
    end = min(len(text), open_idx + _MAX_BOXED_SCAN)
    while i < end:
        c = text[i]
        if c == "\\":  # an escaped character (\{, \}) never counts as a brace
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[open_idx + 1 : i]
        i += 1
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) whose braces balance.

    ``\\boxed 5`` (no braces) gives ``5``. Unbalanced occurrences (a truncated response) are skipped
    in favour of an earlier, complete one.
    """
    positions: list[tuple[int, str]] = []
    for cmd in _BOXED_CMDS:
        start = len(text)
        for _ in range(_MAX_BOXED_TRIES):
            idx = text.rfind(cmd, 0, start)
            if idx < 0:
                break
            positions.append((idx, cmd))
            start = idx
    positions.sort(reverse=True)
    for idx, cmd in positions[:_MAX_BOXED_TRIES]:
        j = idx + len(cmd)
        if j < len(text) and text[j].isalpha():  # e.g. \boxedfoo: another command
            continue
        while j < len(text) and text[j] in " \t":
            j += 1
        if j < len(text) and text[j] == "{":
            inner = _balanced_from(text, j)
            if inner is not None:
                return inner.strip()
        elif j < len(text) and j > idx + len(cmd):  # "\boxed 5"
            m = re.match(r"[^\s$]{1,100}", text[j : j + 100])
            if m:
                return m.group(0)
    return None


_ANSWER_IS_RE = re.compile(r"answer\s{0,3}(?:is|:)", re.IGNORECASE)
_INLINE_MATH_RE = re.compile(r"\$([^$]{1,500})\$")
_SENTENCE_END_RE = re.compile(r"\.(?:\s|$)")


def _line_after(text: str, start: int, limit: int = 300) -> str:
    rest = text[start : start + limit]
    nl = rest.find("\n")
    if nl >= 0:
        rest = rest[:nl]
    return rest.strip()


def _clean_tail(ans: str) -> str:
    m = _INLINE_MATH_RE.search(ans)
    if m:
        ans = m.group(1)
    else:
        m = _SENTENCE_END_RE.search(ans)
        if m:
            ans = ans[: m.start()]
    ans = ans.strip().strip("*").strip()  # markdown bold around the answer
    if ans.endswith("."):
        ans = ans[:-1]
    return ans.strip()


_SPECIAL_TOKEN_RE = re.compile(r"<\|[A-Za-z0-9_]{1,40}\|>|</s>|<s>|<eos>|<bos>|<pad>|<unk>")


def extract_answer(text: str) -> str | None:
    """The final answer of a response, or None when the response does not state one."""
    if not isinstance(text, str) or not text:
        return None
    text = _SPECIAL_TOKEN_RE.sub("", text)  # EOS/pad tokens left in by a decode
    ans: str | None = extract_boxed(text)
    if ans is None:
        idx = text.rfind("####")
        if idx >= 0:
            ans = _clean_tail(_line_after(text, idx + 4).lstrip("#").strip())
    if ans is None:
        # the last "answer is" / "answer:"; scan only the tail so this stays linear
        tail_start = max(0, len(text) - 5000)
        last = None
        for m in _ANSWER_IS_RE.finditer(text, tail_start):
            last = m
        if last is not None:
            ans = _clean_tail(_line_after(text, last.end()).lstrip(":").strip())
    if ans is None and not any(cmd in text for cmd in _BOXED_CMDS):  # not a truncated box
        whole = text.strip()
        if whole and "\n" not in whole and len(whole) <= 40:
            ans = _clean_tail(whole)
    if not ans:
        return None
    return ans[:MAX_ANSWER_CHARS]


def reference_answer(field: str) -> str:
    """Ground-truth final answer from a data-file answer field.

    GSM8K-style solutions end in ``#### 42`` (what follows the last ``####`` is taken); a
    ``\\boxed{...}`` answer gives its content; anything else is a bare answer, used as is.
    """
    field = str(field).strip()
    idx = field.rfind("####")
    if idx >= 0:
        return _line_after(field, idx + 4, limit=10_000).strip()
    boxed = extract_boxed(field)
    if boxed is not None:
        return boxed
    return field


# ------------------------------------------------------------------------------------------------
# Normalisation and numbers (in-process, bounded)
# ------------------------------------------------------------------------------------------------

_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox|mathbf)\s*\{([^{}]{0,200})\}")
_SPACING_RE = re.compile(r"\\[,;:! ]|\\quad|\\qquad|~")
_DEGREE_RE = re.compile(r"\^\s*\{?\\circ\}?|°|\\degree")


def normalize(ans: str) -> str:
    """A canonical spelling for exact string comparison (whitespace, $, \\left/\\right, ...)."""
    s = ans[:MAX_ANSWER_CHARS]
    s = s.replace("\\$", "").replace("$", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("\\displaystyle", "")
    s = _SPACING_RE.sub("", s)
    s = _DEGREE_RE.sub("", s)
    s = _TEXT_CMD_RE.sub(r"\1", s)
    s = s.replace("\\%", "%")
    s = "".join(s.split())
    s = s.rstrip(".")
    return s


_UNIT_TAIL_RE = re.compile(r"(?:\\(?:text|mbox|mathrm)\{[^{}]{0,50}\})+$")
_PLAIN_NUM_RE = re.compile(r"([+-]?)(\d{1,3}(?:,\d{3})+|\d*)(?:\.(\d+))?")
_PERCENT_RE = re.compile(r"(?:%|\\%|percent)$", re.IGNORECASE)
_FRAC_RE = re.compile(r"([+-]?)\\frac\{([^{}]{1,80})\}\{([^{}]{1,80})\}")


def _plain_number(s: str) -> Fraction | None:
    m = _PLAIN_NUM_RE.fullmatch(s)
    if not m:
        return None
    sign, whole, dec = m.group(1), m.group(2), m.group(3)
    whole = whole.replace(",", "")
    if not whole and not dec:
        return None
    if len(whole) + len(dec or "") > MAX_NUMBER_DIGITS:
        return None
    value = Fraction(int(whole or "0"))
    if dec:
        value += Fraction(int(dec), 10 ** len(dec))
    return -value if sign == "-" else value


_UNIT_WORD_RE = re.compile(r"[A-Za-z]{3,}\.?")
_NOT_UNITS = frozenset(
    """and or times plus minus over divided by squared cubed root sqrt factorial hundred thousand
    million billion trillion dozen dozens half halves third thirds quarter quarters fifth fifths
    tenth tenths hundredth hundredths thousandth thousandths percent percentage pct pi not""".split()
)


def _strip_unit_words(s: str) -> str:
    """``72 clips`` -> ``72``: up to three trailing plain words after a number are a unit.

    Words that change the value (``million``, ``times``, ``pi``, ``or``...) are not units, so
    ``5 million`` or ``72 or 73`` stay as they are (and then do not parse as a number).
    """
    tokens = s.split()
    n_words = 0
    while n_words < min(3, len(tokens) - 1) and _UNIT_WORD_RE.fullmatch(tokens[-1 - n_words]):
        n_words += 1
    if n_words == 0:
        return s
    words = [w.rstrip(".").lower() for w in tokens[-n_words:]]
    if len(tokens) - n_words != 1 or any(w in _NOT_UNITS for w in words):
        return s  # not "<number> <1-3 words>", or a value-changing word
    return tokens[0]


def parse_number(ans: str) -> tuple[Fraction, bool] | None:
    """`(value, is_percent)` when `ans` is a plain number, fraction or percentage; else None."""
    if len(ans) > 200:
        return None
    s = _strip_unit_words(ans.strip())
    s = s.replace("\\$", "").replace("$", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = _SPACING_RE.sub("", s)
    s = _DEGREE_RE.sub("", s)
    s = "".join(s.split())
    s = _UNIT_TAIL_RE.sub("", s)
    s = s.rstrip(".")
    for cur in ("€", "£", "¥", "₹"):
        s = s.replace(cur, "")
    is_pct = False
    m = _PERCENT_RE.search(s)
    if m:
        is_pct = True
        s = s[: m.start()]
    if s.startswith("(") and s.endswith(")"):
        s = s[1:-1]
    value = _plain_number(s)
    if value is None:
        fm = _FRAC_RE.fullmatch(s)
        if fm:
            num, den = _plain_number(fm.group(2)), _plain_number(fm.group(3))
            if num is not None and den:
                value = num / den
                if fm.group(1) == "-":
                    value = -value
        elif s.count("/") == 1:
            a, b = s.split("/")
            num, den = _plain_number(a), _plain_number(b)
            if num is not None and den:
                value = num / den
    if value is None:
        return None
    return value, is_pct


def numbers_equal(gold: tuple[Fraction, bool], pred: tuple[Fraction, bool]) -> bool:
    (g, g_pct), (p, p_pct) = gold, pred
    if g == p:
        return True
    if p_pct and p / 100 == g:
        return True
    if g_pct and g / 100 == p:
        return True
    return False


# ------------------------------------------------------------------------------------------------
# What may reach the CAS
# ------------------------------------------------------------------------------------------------

_CAS_CHARS_RE = re.compile(r"[A-Za-z0-9\s+\-*/^_=<>()\[\]{}.,;:!|%\\]*")
_CAS_CMD_RE = re.compile(r"\\([A-Za-z]+|.)")
CAS_COMMANDS = frozenset(
    """
    frac dfrac tfrac sqrt cdot times div pm mp pi infty infinity le leq ge geq lt gt ne neq approx
    left right sin cos tan sec csc cot arcsin arccos arctan sinh cosh tanh log ln exp lg
    circ degree text textbf textrm mathrm mbox mathbf operatorname mathbb mathcal
    in notin cup cap emptyset varnothing setminus subset subseteq supset supseteq
    alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi
    rho sigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Pi Sigma Phi Psi Omega
    binom dbinom tbinom choose lfloor rfloor lceil rceil floor ceil quad qquad displaystyle
    dots ldots cdots prime overline bar hat vec mid angle perp parallel equiv cong sim
    to rightarrow Rightarrow land lor wedge vee neg lnot max min gcd lcm det mod pmod bmod
    """.split()
) | frozenset(",;:! {}%|\\")


def cas_safe(ans: str) -> bool:
    """Whether `ans` may be handed to math-verify's LaTeX parser (see module docstring)."""
    if not ans or len(ans) > MAX_CAS_CHARS:
        return False
    if not _CAS_CHARS_RE.fullmatch(ans) or "__" in ans:
        return False
    depth = 0
    for c in ans.replace("\\{", "").replace("\\}", ""):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:
                return False
    if depth != 0:
        return False
    return all(cmd in CAS_COMMANDS for cmd in _CAS_CMD_RE.findall(ans))


def _cas_prepare(ans: str) -> str:
    return ans.replace("\\$", "").replace("$", "").strip()


_NUMERIC_LITERAL_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER_LITERAL_RE = re.compile(r"[+-]?\d+")
_HARDENED = False
_ORIGINALS: dict = {}


def _literal_number(text: str):
    """`sympy.Number(text)` for a numeric literal, built without sympify/parse_expr (no eval)."""
    import sympy

    t = text.strip()
    if _INTEGER_LITERAL_RE.fullmatch(t):
        return sympy.Integer(int(t))
    if _NUMERIC_LITERAL_RE.fullmatch(t):
        return sympy.Float(t)
    raise ValueError(f"not a numeric literal: {t[:40]!r}")


def _harden_latex2sympy() -> None:
    """Route latex2sympy's two number constructors around ``sympy.Number(str)``.

    ``_Latex2Sympy.parse_number`` and ``convert_number`` call ``sympy.Number(text)``, i.e.
    ``sympify(text)`` -> ``parse_expr`` -> ``eval``. The text is a lexer token that can only hold
    digits, ``.``, ``E``, ``+``, ``-``, ``%`` (checked by fuzzing the lexer), so this is not
    exploitable, but it is eval of model text; we replace both with `_literal_number`, which builds
    the same ``Integer``/``Float`` directly and refuses anything that is not a numeric literal.
    """
    global _HARDENED
    if _HARDENED:
        return
    import latex2sympy2_extended.latex2sympy2 as l2s

    def parse_number(self, text):
        return _literal_number(text.replace(",", ""))

    def convert_number(number: str):
        if "," in number and number.startswith("0"):  # 0,111 is a decimal comma
            number = number.replace(",", ".")
        return _literal_number(number.replace(",", "").replace(" ", ""))

    if not (
        hasattr(l2s, "_Latex2Sympy")
        and hasattr(l2s._Latex2Sympy, "parse_number")
        and hasattr(l2s, "convert_number")
    ):
        raise RuntimeError("latex2sympy2_extended changed: cannot harden its number parsing")
    _ORIGINALS.update(parse_number=l2s._Latex2Sympy.parse_number, convert_number=l2s.convert_number)
    l2s._Latex2Sympy.parse_number = parse_number
    l2s.convert_number = convert_number
    _HARDENED = True


def cas_equal(gold: str, pred: str) -> bool:
    """math-verify equivalence of two whitelisted answers, LaTeX extraction only.

    Runs inside a worker process (it has no timeout of its own); exceptions propagate.
    """
    _harden_latex2sympy()
    from math_verify import LatexExtractionConfig, parse, verify

    cfg = [LatexExtractionConfig(boxed_match_priority=0)]
    g = parse(
        "\\boxed{" + gold + "}",
        extraction_config=cfg,
        fallback_mode="no_fallback",
        parsing_timeout=None,
        raise_on_error=True,
    )
    p = parse(
        "\\boxed{" + pred + "}",
        extraction_config=cfg,
        fallback_mode="no_fallback",
        parsing_timeout=None,
        raise_on_error=True,
    )
    if not g or not p:
        return False
    return bool(verify(g, p, timeout_seconds=None, raise_on_error=True))


# ------------------------------------------------------------------------------------------------
# Worker processes with per-call deadlines
# ------------------------------------------------------------------------------------------------


class _WorkerDied(Exception):
    pass


def _wait_readable(fds: list[int], timeout: float) -> list[int]:
    """The fds among `fds` that are readable (data or EOF) within `timeout` seconds."""
    if hasattr(select, "poll"):  # no FD_SETSIZE limit, unlike select()
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        return [fd for fd, _ in poller.poll(max(0, int(math.ceil(timeout * 1000))))]
    ready, _, _ = select.select(fds, [], [], max(0.0, timeout))
    return ready


class _Worker:
    def __init__(self, start_timeout: float, mem_limit_bytes: int | None):
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["VAPO_CAS_MEM_LIMIT"] = str(mem_limit_bytes or 0)
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[var] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-c", "from vapo_lit.tasks.answers import _worker_main; _worker_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        self.fd = self.proc.stdout.fileno()
        self.buf = b""
        self.job: int | None = None
        self.deadline = 0.0
        try:
            msg = self.read_line(time.monotonic() + start_timeout)
        except (_WorkerDied, ValueError) as e:
            self.kill()
            raise _WorkerDied(f"checker worker failed to start: {e}") from None
        if msg is None:
            self.kill()
            raise _WorkerDied(f"checker worker did not start within {start_timeout:.0f} s")
        if not msg.get("ready"):
            self.kill()
            raise _WorkerDied(f"checker worker failed to start: {msg.get('error')}")

    def send(self, job: int, gold: str, pred: str, timeout: float) -> None:
        data = json.dumps({"gold": gold, "pred": pred, "timeout": timeout}) + "\n"
        try:
            self.proc.stdin.write(data.encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError) as e:
            raise _WorkerDied(f"checker worker gone ({e})") from e
        self.job = job
        self.deadline = time.monotonic() + timeout

    def try_line(self) -> dict | None:
        nl = self.buf.find(b"\n")
        if nl < 0:
            return None
        line, self.buf = self.buf[:nl], self.buf[nl + 1 :]
        return json.loads(line)

    def feed(self) -> None:
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            raise _WorkerDied(f"checker worker exited (code {self.proc.poll()})")
        self.buf += chunk

    def read_line(self, deadline: float) -> dict | None:
        while True:
            msg = self.try_line()
            if msg is not None:
                return msg
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if _wait_readable([self.fd], left):
                self.feed()

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except Exception:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except Exception:
                pass


class CheckerPool:
    """A few persistent worker processes running `cas_equal` under per-call deadlines."""

    def __init__(self, size: int = 1, start_timeout: float = 60.0, mem_limit_bytes: int | None = 4 << 30):
        self.size = max(1, int(size))
        self.start_timeout = start_timeout
        self.mem_limit_bytes = mem_limit_bytes
        self._workers: list[_Worker | None] = [None] * self.size
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.timeouts = 0
        self.restarts = 0
        _POOLS.add(self)

    def close(self) -> None:
        """Kill the workers (a later call starts fresh ones)."""
        if os.getpid() != self._pid:  # a forked copy: the workers belong to the parent
            self._workers = [None] * self.size
            return
        for i, w in enumerate(self._workers):
            if w is not None:
                w.kill()
                self._workers[i] = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001  (interpreter shutdown)
            pass

    def __getstate__(self):
        return {
            "size": self.size,
            "start_timeout": self.start_timeout,
            "mem_limit_bytes": self.mem_limit_bytes,
        }

    def __setstate__(self, state):
        self.__init__(**state)

    def _get(self, i: int) -> _Worker:
        w = self._workers[i]
        if w is None or w.proc.poll() is not None:
            if w is not None:
                w.kill()
                self.restarts += 1
            w = _Worker(self.start_timeout, self.mem_limit_bytes)
            self._workers[i] = w
        return w

    def _retire(self, i: int) -> None:
        w = self._workers[i]
        if w is not None:
            w.kill()
        self._workers[i] = None

    def check(self, pairs: Sequence[tuple[str, str]], timeout: float) -> list[tuple[bool, str | None]]:
        """`(equal, error)` per (gold, pred) pair; error is ``"timeout: ..."`` or ``"exception: ..."``."""
        if os.getpid() != self._pid:  # forked: never share the parent's pipes
            self._workers = [None] * self.size
            self._lock = threading.Lock()
            self._pid = os.getpid()
        with self._lock:
            return self._check(list(pairs), timeout)

    def _check(self, pairs: list[tuple[str, str]], timeout: float) -> list[tuple[bool, str | None]]:
        results: list[tuple[bool, str | None] | None] = [None] * len(pairs)
        pending = list(range(len(pairs)))
        pending.reverse()
        busy: dict[int, _Worker] = {}  # slot -> worker
        while pending or busy:
            # hand out jobs to idle slots
            for slot in range(self.size):
                if not pending:
                    break
                if slot in busy:
                    continue
                job = pending.pop()
                gold, pred = pairs[job]
                try:
                    w = self._get(slot)
                    try:
                        w.send(job, gold, pred, timeout)
                    except _WorkerDied:  # died while idle: one fresh worker, one more try
                        self._retire(slot)
                        w = self._get(slot)
                        w.send(job, gold, pred, timeout)
                    busy[slot] = w
                except _WorkerDied as e:
                    self._retire(slot)
                    results[job] = (False, f"exception: {e}")
            if not busy:
                continue
            now = time.monotonic()
            wait = max(0.0, min(w.deadline for w in busy.values()) - now)
            fds = {w.fd: slot for slot, w in busy.items()}
            ready = _wait_readable(list(fds), wait)
            for fd in ready:
                slot = fds[fd]
                w = busy[slot]
                try:
                    w.feed()
                    msg = w.try_line()
                except _WorkerDied as e:
                    results[w.job] = (False, f"exception: {e}")
                    self._retire(slot)
                    del busy[slot]
                    continue
                if msg is not None:
                    results[w.job] = (bool(msg.get("equal")), msg.get("error"))
                    w.job = None
                    del busy[slot]
            now = time.monotonic()
            for slot, w in list(busy.items()):
                if now >= w.deadline and w.job is not None and results[w.job] is None:
                    results[w.job] = (False, f"timeout: symbolic check exceeded {timeout:g} s")
                    self.timeouts += 1
                    self._retire(slot)
                    del busy[slot]
        return [r if r is not None else (False, "exception: no result") for r in results]


_POOLS: "weakref.WeakSet[CheckerPool]" = weakref.WeakSet()


@atexit.register
def _close_all_pools() -> None:
    for pool in list(_POOLS):
        try:
            pool.close()
        except Exception:  # noqa: BLE001
            pass


def _set_rlimit(kind: int, soft: int) -> None:
    import resource

    _, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(kind, (soft, hard))


def _worker_main() -> None:
    """Entry point of a checker worker: JSON lines in on stdin, JSON lines out on stdout."""
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr  # a stray print from a library cannot corrupt the protocol
    try:
        import logging
        import resource

        logging.disable(logging.CRITICAL)
        mem = int(os.environ.get("VAPO_CAS_MEM_LIMIT", "0") or 0)
        if mem > 0:
            try:
                _set_rlimit(resource.RLIMIT_AS, mem)
            except (ValueError, OSError):
                pass
        import math_verify  # noqa: F401  (import cost paid before "ready")

        cas_equal("1", "1")  # warm the parser
    except BaseException as e:  # noqa: BLE001
        out.write(json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}"}) + "\n")
        return
    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        try:
            used = resource.getrusage(resource.RUSAGE_SELF)
            cpu = used.ru_utime + used.ru_stime
            _set_rlimit(resource.RLIMIT_CPU, int(math.ceil(cpu + float(req.get("timeout", 5)))) + 2)
        except (ValueError, OSError):
            pass
        try:
            resp = {"equal": cas_equal(str(req["gold"]), str(req["pred"])), "error": None}
        except BaseException as e:  # noqa: BLE001  (MemoryError, RecursionError, sympy errors...)
            try:
                detail = f"{type(e).__name__}: {str(e)[:200]}"
            except BaseException:  # noqa: BLE001
                detail = type(e).__name__
            resp = {"equal": False, "error": f"exception: {detail}"}
        out.write(json.dumps(resp) + "\n")


_DEFAULT_POOL: CheckerPool | None = None
_DEFAULT_POOL_LOCK = threading.Lock()


def default_pool() -> CheckerPool:
    global _DEFAULT_POOL
    with _DEFAULT_POOL_LOCK:
        if _DEFAULT_POOL is None:
            _DEFAULT_POOL = CheckerPool(size=1)
        return _DEFAULT_POOL


# ------------------------------------------------------------------------------------------------
# Verdicts
# ------------------------------------------------------------------------------------------------


def _fast_verdict(gold: str, response: str) -> tuple[Verdict | None, tuple[str, str] | None]:
    """(final verdict, None) or (None, (gold, pred) for the CAS). Never raises."""
    try:
        pred = extract_answer(response)
        if pred is None:
            return Verdict(0.0), None
        if normalize(pred) == normalize(gold) and normalize(gold):
            return Verdict(1.0), None
        g_num, p_num = parse_number(gold), parse_number(pred)
        if g_num is not None and p_num is not None:
            return Verdict(1.0 if numbers_equal(g_num, p_num) else 0.0), None
        g_cas, p_cas = _cas_prepare(gold), _cas_prepare(pred)
        if not (cas_safe(g_cas) and cas_safe(p_cas)):
            return Verdict(0.0), None
        return None, (g_cas, p_cas)
    except Exception as e:  # noqa: BLE001  (a bug here is a verifier error, not a wrong answer)
        return Verdict(0.0, error=f"exception: {type(e).__name__} in answer extraction"), None


def check_batch(
    golds: Sequence[str],
    responses: Sequence[str],
    *,
    pool: CheckerPool | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    use_cas: bool = True,
) -> list[Verdict]:
    """Verdicts for `responses[i]` against ground-truth answers `golds[i]`. Never raises."""
    verdicts: list[Verdict | None] = []
    cas_jobs: list[tuple[int, tuple[str, str]]] = []
    for i, (gold, resp) in enumerate(zip(golds, responses)):
        v, job = _fast_verdict(str(gold), resp if isinstance(resp, str) else "")
        verdicts.append(v)
        if job is not None:
            cas_jobs.append((i, job))
    if cas_jobs:
        if not use_cas:
            for i, _ in cas_jobs:
                verdicts[i] = Verdict(0.0)
        else:
            try:
                results = (pool or default_pool()).check([j for _, j in cas_jobs], timeout)
            except Exception as e:  # noqa: BLE001
                results = [(False, f"exception: {type(e).__name__}: {e}")] * len(cas_jobs)
            for (i, _), (equal, error) in zip(cas_jobs, results):
                verdicts[i] = Verdict(0.0, error=error) if error else Verdict(1.0 if equal else 0.0)
    return [v if v is not None else Verdict(0.0, error="exception: no verdict") for v in verdicts]


def check_answer(gold: str, response: str, **kwargs) -> Verdict:
    """Verdict of one response against the ground-truth final answer `gold`. Never raises."""
    return check_batch([gold], [response], **kwargs)[0]


__all__ = [
    "CheckerPool",
    "cas_equal",
    "cas_safe",
    "check_answer",
    "check_batch",
    "default_pool",
    "extract_answer",
    "extract_boxed",
    "normalize",
    "numbers_equal",
    "parse_number",
    "reference_answer",
]
