"""Pinned (issue 47): the JSON-schema argument check of chat tools (a union type accepts each of its
members; a bool is neither a number nor an integer) and the calculator of `math_tools` (results past
its bound refused whatever their sign, literals included; every 200-character input refused or
answered fast and in little memory), each at the lowest level that shows it.

The hostile-input table runs in a child process with a time limit and an address-space limit: a
change that lets a case grow without bound fails the test instead of hanging it or eating the
machine.

    .venv/bin/python -m pytest tests/test_pinned_tools.py
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vapo_lit.tasks.base import Problem
from vapo_lit.tasks.env import ToolError, check_arguments
from vapo_lit.tasks.math_tools import CALCULATOR, MAX_EXPRESSION, MAX_MAGNITUDE, calculate


# ----------------------------------------------------------------------------- argument schemas
def _schema(kind) -> dict:
    return {
        "type": "object",
        "properties": {"x": {"type": kind}},
        "required": ["x"],
        "additionalProperties": False,
    }


def _accepts(kind, value) -> bool:
    try:
        check_arguments(_schema(kind), {"x": value})
    except ToolError:
        return False
    return True


@pytest.mark.parametrize(
    "kind, accepted, refused",
    [
        (["integer", "null"], [3, -7, 0, None], ["3", 2.5, True, False, [3], {"x": 3}]),
        (["null", "integer"], [None, 3], ["", 0.5, True]),  # the order of the members is no matter
        (["string", "number"], ["3", "", 3, 2.5, -0.0], [True, None, ["3"]]),
        (["boolean", "null"], [True, False, None], [0, 1, "true"]),
        (["array", "object"], [[], [1], {}, {"a": 1}], ["[]", None, 0]),
    ],
)
def test_a_union_type_accepts_each_member_and_nothing_else(kind, accepted, refused):
    for value in accepted:
        assert _accepts(kind, value), (kind, value)
    for value in refused:
        assert not _accepts(kind, value), (kind, value)


@pytest.mark.parametrize("kind", ["number", "integer", ["number", "null"], ["integer", "string"]])
def test_a_bool_is_neither_a_number_nor_an_integer(kind):
    """JSON's true/false is not 1/0 (Python's bool is an int subclass: the check must say so)."""
    for value in (True, False):
        with pytest.raises(ToolError, match="^argument x must be "):
            check_arguments(_schema(kind), {"x": value})
    assert _accepts(kind, 1) and _accepts(kind, 0)
    assert _accepts("boolean", True) and not _accepts("boolean", 1)


def test_a_number_is_an_int_or_a_float():
    assert all(_accepts("number", v) for v in (0, -3, 10**40, 2.5, -1e-9))
    assert not any(_accepts("number", v) for v in ("1", None, [1], {"a": 1}))
    assert _accepts("integer", -3) and not _accepts("integer", 2.5)


# ----------------------------------------------------------------------------- the calculator's bound
@pytest.mark.parametrize(
    "expression",
    [
        "-(10**30)-1",
        "0-10**30-1",
        "(-10)**31",
        "-(10**15)*(10**15)*10",
        "(-10**15)*10**15*(-1)*10",
        "(-9)**63",
        "((-2)**60)*(-(2**60))",
        "1+(-10)**30*(-10)",
        "((-10)**31)//1",
        "-1e30",
        "-1e29*10.5",
        "(-10**10)**4",
        "-" + "9" * 31,
        "-" + "9" * 190,
        "-1e999",
        "(-1e999)*0",
        "0-(" + "9" * 60 + ")",
    ],
)
def test_a_negative_result_past_the_bound_is_refused(expression):
    """Refused as a positive one would be: the bound is on the magnitude (literals too)."""
    with pytest.raises(ToolError):
        calculate(expression)
    with pytest.raises(ToolError):  # and its mirror image
        calculate(f"-({expression})")


@pytest.mark.parametrize(
    "expression, value",
    [
        ("-(10**30)", -MAX_MAGNITUDE),
        ("(-10)**30", MAX_MAGNITUDE),
        ("(-10)**29*10", -MAX_MAGNITUDE),
        ("-(10**29)*10", -MAX_MAGNITUDE),
        ("(-2)**63", -(2**63)),
        ("-" + "9" * 30, 1 - 10**30),
        ("(-3)**-2", 1 / 9),
        ("-1e29*10", -1e29 * 10),
    ],
)
def test_a_negative_result_within_the_bound_is_answered(expression, value):
    assert calculate(expression) == value


def test_nan_is_out_of_range():
    """inf - inf is NaN, and NaN compares false with everything: 'abs(x) > bound' would let it through."""
    for expression in ("1e999-1e999", "1e999*0", "(1e300*1e300)-(1e300*1e300)"):
        with pytest.raises(ToolError):
            calculate(expression)


# ----------------------------------------------------------------------------- hostile inputs
REFUSED = "refused"
HOSTILE = [
    # powers of a negative base, nested and inside other operations
    ("(-9)**(9**9)", REFUSED),
    ("(((-10)**31)**63)**63", REFUSED),
    ("((((-10)**31)**63)**63)**9", REFUSED),  # about 3.7 million bits if a negative result escaped
    ("-((-2)**62*(-2)**62)", REFUSED),
    ("2*(-(10**20))**2*(-1)", REFUSED),
    ("(-2)**63", -(2**63)),
    # towers and long chains of **
    ("2**" * 66 + "2", REFUSED),
    ("(-1)" + "**9" * 48, REFUSED),
    ("(" * 32 + "-2" + "**2)" * 32, REFUSED),
    ("9" * 30 + "**64", REFUSED),
    # products that grow big integers
    ("1" + "*9" * 99, REFUSED),
    ("(-1)" + "*99" * 49, REFUSED),
    ("(" + "9" * 29 + ")*" + "(" + "9" * 29 + ")*" * 5 + "1", REFUSED),
    # huge literals, inf and NaN
    ("9" * MAX_EXPRESSION, REFUSED),
    ("-" + "9" * (MAX_EXPRESSION - 1), REFUSED),
    ("1e999", REFUSED),
    ("1e999-1e999", REFUSED),
    ("10**30/1e-300", REFUSED),
    # nesting and unary chains
    ("(" * 99 + "-1" + ")" * 99, -1),
    ("(" * 101 + "1" + ")" * 98, REFUSED),  # unbalanced: not an expression
    ("-" * 195 + "7", (-1) ** 195 * 7),
    ("+-" * 99 + "1", (-1) ** 99),
    ("-" * 150 + "(10**30*10)", REFUSED),
    # operators it does not have, and text that is not arithmetic
    ("1<<64<<64<<64", REFUSED),
    ("~" * 100 + "1", REFUSED),
    ("9" * 10 + "^" + "9" * 10, REFUSED),
    ("'9'*10**6", REFUSED),
    ("[9]*10**6", REFUSED),
    ("x" * (MAX_EXPRESSION + 1), REFUSED),
]
MAX_SECONDS = 0.1
"""Each case's best of three tries (a loaded 2-core machine: the cases take well under 1 ms)."""
MAX_PEAK_BYTES = 2 << 20
"""Peak Python allocation of one case (tracemalloc; ast.parse of 200 characters is about 0.1 MB)."""
CHILD_SECONDS = 30
CHILD = r"""
import json, math, sys, time, tracemalloc
try:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a runaway case: MemoryError, not the machine's memory
except (ImportError, ValueError, OSError):
    pass
from vapo_lit.tasks.env import ToolError
from vapo_lit.tasks.math_tools import calculate

def once(expression):
    try:
        value = calculate(expression)
    except ToolError:
        return "refused"
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if abs(value) > 10 ** 40:  # (a slip's huge int: no JSON, no repr past 4300 digits)
        return f"a value of {int(abs(value)).bit_length()} bits"
    return value

for expression in json.loads(sys.argv[1]):
    seconds = []
    for _ in range(3):
        t0 = time.perf_counter()
        try:
            outcome = once(expression)
        except BaseException as e:  # anything but ToolError escaping is itself a failure
            outcome = f"raised {type(e).__name__}"
        seconds.append(time.perf_counter() - t0)
    tracemalloc.start()
    try:
        once(expression)
    except BaseException:
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(json.dumps({"outcome": outcome, "seconds": min(seconds), "peak": peak}), flush=True)
"""


@pytest.fixture(scope="module")
def hostile_results() -> list:
    """One child process runs the table in order; a case it did not finish (timeout, crash) and every
    case after it read as None."""
    expressions = [e for e, _ in HOSTILE]
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(expressions)],
            capture_output=True,
            text=True,
            timeout=CHILD_SECONDS,
        )
        out = done.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rows + [None] * (len(expressions) - len(rows))


def test_the_hostile_table_is_big_and_every_case_fits_the_length_limit():
    assert len(HOSTILE) >= 10
    assert (
        sum(len(e) <= MAX_EXPRESSION for e, _ in HOSTILE) == len(HOSTILE) - 1
    )  # one is refused for its length
    assert len({e for e, _ in HOSTILE}) == len(HOSTILE)


@pytest.mark.parametrize("index", range(len(HOSTILE)), ids=[e[:24] for e, _ in HOSTILE])
def test_a_hostile_input_is_refused_or_answered_fast_in_little_memory(hostile_results, index):
    expression, want = HOSTILE[index]
    got = hostile_results[index]
    assert got is not None, f"{expression!r} (or a case before it) did not finish within {CHILD_SECONDS} s"
    wrong = [f"outcome {got['outcome']!r}, want {want!r}"] if got["outcome"] != want else []
    wrong += [f"{got['seconds']:.3f} s (best of 3)"] if got["seconds"] >= MAX_SECONDS else []
    wrong += [f"peak {got['peak'] / 2**20:.2f} MiB"] if got["peak"] >= MAX_PEAK_BYTES else []
    assert not wrong, f"{expression!r}: " + "; ".join(wrong)


# ----------------------------------------------------------------------------- siblings
@pytest.fixture(scope="module")
def calculator(tmp_path_factory):
    """The math_tools task (a ChatML tokenizer, two problems): its calculator tool as it declares it."""
    from test_chat_episodes import chat_tokenizer

    from vapo_lit.tasks import get_task

    tmp = tmp_path_factory.mktemp("math_tools")
    chat_tokenizer("chatml").save_pretrained(tmp / "tok")
    (tmp / "train.jsonl").write_text(
        '{"question": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": "4"}\n'
    )
    task = get_task(
        "math_tools", train_path=str(tmp / "train.jsonl"), tokenizer=str(tmp / "tok"), instruction=""
    )
    assert task.tools["calculator"].parameters == CALCULATOR
    yield task
    task.close()


def _call(env, arguments) -> str:
    turn = "<tool_call>" + json.dumps({"name": "calculator", "arguments": arguments}) + "</tool_call>"
    return env.call_tool(Problem("p", "0", {}), turn)


@pytest.mark.parametrize(
    "expression, text",
    [
        ("6 / 2", "3"),  # a whole float reads as an integer
        ("7 / 2", "3.5"),
        ("0.1 + 0.2", "0.3"),  # rounded to 10 places: no float noise in the observation
        ("1 / 3", "0.3333333333"),
        ("-1 / 3", "-0.3333333333"),
        ("2 ** 0.5", "1.4142135624"),
        ("1e20", "100000000000000000000"),
        ("-(10**30)", "-" + "1" + "0" * 30),
        ("12 * 7", "84"),
    ],
)
def test_the_calculator_observation_text(calculator, expression, text):
    assert _call(calculator, {"expression": expression}) == text


@pytest.mark.parametrize(
    "arguments",
    [
        {"expression": 12},
        {"expression": True},
        {"expression": None},
        {},
        {"expression": "1", "precision": 3},
        {"expression": "(-10)**31"},
        {"expression": "9" * 31},
        {"expression": "import os"},
    ],
)
def test_the_calculator_refuses_what_its_schema_or_its_bound_refuse(calculator, arguments):
    assert _call(calculator, arguments) == "error bad args"
