"""The built-in problems of `math` and `math_tools`: arithmetic word problems generated in code.

Two levels, each a set of templates filled with numbers from a seeded `random.Random`, so a set is the
same on every machine and needs no download and no licence:

* `multi-step` (the default): a dozen templates (a warehouse's stock, change from a purchase, a journey
  in two legs, packs to buy, savings, a theatre's takings, ...) whose answer is a positive integer
  reached in two to four steps, most of them products of two- and three-digit numbers: what a
  calculator helps with.
* `one-step`: one operation (a sum, a difference, a product, an exact share) on numbers of one to
  three digits, the size drawn per problem: the small ones within reach of a small chat model's own
  arithmetic, the large ones where the calculator pays. For models that solve too few multi-step
  problems for a 0/1 reward to carry any signal.

`problems("train", level=...)` gives `TRAIN_SIZE` problems and `problems("eval", level=...)`
`EVAL_SIZE`; no eval question is a train question.
"""

from __future__ import annotations

import random

VERSION = "1"
"""Bumped whenever the generator changes what it writes (it is part of the task's version)."""
TRAIN_SIZE = 512
EVAL_SIZE = 64
SPLITS = ("train", "eval")
LEVELS = ("multi-step", "one-step")

_NAMES = (
    "Ana",
    "Ben",
    "Chen",
    "Dara",
    "Eli",
    "Fatima",
    "Gus",
    "Hana",
    "Ivan",
    "Jia",
    "Kofi",
    "Lena",
    "Mateo",
    "Nia",
    "Omar",
    "Priya",
    "Ravi",
    "Sofia",
    "Tomas",
    "Yuki",
)


def _stock(r: random.Random) -> tuple[str, int, str]:
    boxes, per, out, come = r.randint(12, 60), r.randint(12, 48), r.randint(20, 300), r.randint(20, 300)
    out = min(out, boxes * per - 1)
    return (
        f"A warehouse holds {boxes} boxes with {per} bottles in each. Then {out} bottles are shipped out and "
        f"{come} new bottles arrive. How many bottles are in the warehouse now?",
        boxes * per - out + come,
        f"{boxes} * {per} - {out} + {come}",
    )


def _change(r: random.Random) -> tuple[str, int, str]:
    name = r.choice(_NAMES)
    a, p, b, q = r.randint(3, 15), r.randint(4, 29), r.randint(2, 12), r.randint(2, 19)
    total = a * p + b * q
    bill = (total // 100 + 1) * 100
    return (
        f"{name} buys {a} notebooks at {p} dollars each and {b} pens at {q} dollars each, and pays with "
        f"{bill} dollars. How many dollars of change does {name} get?",
        bill - total,
        f"{bill} - ({a} * {p} + {b} * {q})",
    )


def _journey(r: random.Random) -> tuple[str, int, str]:
    v, t, w, u = r.randint(40, 120), r.randint(2, 9), r.randint(30, 110), r.randint(2, 9)
    return (
        f"A train travels at {v} kilometres per hour for {t} hours, then at {w} kilometres per hour for {u} "
        f"hours. How many kilometres does it travel in total?",
        v * t + w * u,
        f"{v} * {t} + {w} * {u}",
    )


def _packs(r: random.Random) -> tuple[str, int, str]:
    classes, size, each, pack = (
        r.randint(4, 24),
        r.randint(18, 35),
        r.randint(2, 6),
        r.choice((8, 10, 12, 16, 24)),
    )
    need = classes * size * each
    return (
        f"A school has {classes} classes of {size} students, and each student needs {each} pencils. Pencils come "
        f"in packs of {pack}. What is the smallest number of packs the school must buy?",
        -(-need // pack),
        f"-(-({classes} * {size} * {each}) // {pack})",
    )


def _orchard(r: random.Random) -> tuple[str, int, str]:
    rows, trees, apples, bag = (
        r.randint(6, 30),
        r.randint(8, 25),
        r.randint(20, 90),
        r.choice((6, 8, 12, 15, 20)),
    )
    return (
        f"A farmer has {rows} rows of {trees} apple trees, and each tree gives {apples} apples. The apples are "
        f"sold in bags of {bag}. How many full bags can the farmer fill?",
        rows * trees * apples // bag,
        f"{rows} * {trees} * {apples} // {bag}",
    )


def _savings(r: random.Random) -> tuple[str, int, str]:
    name = r.choice(_NAMES)
    a, weeks = r.randint(15, 95), r.randint(8, 52)
    saved = a * weeks
    bike = r.randint(saved // 4, saved // 2)
    helmet = r.randint(10, max(11, saved // 6))
    return (
        f"{name} saves {a} dollars every week for {weeks} weeks, then spends {bike} dollars on a bike and "
        f"{helmet} dollars on a helmet. How many dollars does {name} have left?",
        saved - bike - helmet,
        f"{a} * {weeks} - {bike} - {helmet}",
    )


def _printer(r: random.Random) -> tuple[str, int, str]:
    rate, hours, minutes = r.randint(12, 75), r.randint(1, 6), r.randint(5, 55)
    return (
        f"A printer prints {rate} pages per minute. How many pages does it print in {hours} hours and "
        f"{minutes} minutes?",
        rate * (60 * hours + minutes),
        f"{rate} * (60 * {hours} + {minutes})",
    )


def _theatre(r: random.Random) -> tuple[str, int, str]:
    rows, seats = r.randint(12, 40), r.randint(15, 36)
    sold = r.randint(rows * seats // 4, rows * seats * 3 // 4)
    p, q = r.randint(20, 80), r.randint(8, 19)
    return (
        f"A theatre has {rows} rows of {seats} seats and every seat is sold for a show: {sold} tickets at {p} "
        f"dollars and the rest at {q} dollars. How many dollars does the theatre take?",
        sold * p + (rows * seats - sold) * q,
        f"{sold} * {p} + ({rows} * {seats} - {sold}) * {q}",
    )


def _garden(r: random.Random) -> tuple[str, int, str]:
    length, width, path = r.randint(12, 95), r.randint(8, 60), r.randint(2, 4)
    return (
        f"A rectangular garden is {length} metres long and {width} metres wide. A path {path} metres wide runs "
        f"all around the outside of it. What is the area of the path in square metres?",
        (length + 2 * path) * (width + 2 * path) - length * width,
        f"({length} + 2 * {path}) * ({width} + 2 * {path}) - {length} * {width}",
    )


def _factory(r: random.Random) -> tuple[str, int, str]:
    machines, per_hour, hours, broken = (
        r.randint(4, 18),
        r.randint(35, 140),
        2 * r.randint(3, 8),
        r.randint(1, 3),
    )
    return (
        f"A factory runs {machines} machines for {hours} hours, and each machine makes {per_hour} parts an hour. "
        f"{broken} of the machines stop after half of the hours. How many parts are made?",
        machines * per_hour * hours - broken * per_hour * hours // 2,
        f"{machines} * {per_hour} * {hours} - {broken} * {per_hour} * {hours} // 2",
    )


def _recipe(r: random.Random) -> tuple[str, int, str]:
    serves, flour, guests = r.choice((4, 6, 8)), r.randint(120, 480), r.randint(10, 60)
    batches = -(-guests // serves)
    return (
        f"A recipe for {serves} people uses {flour} grams of flour. A cook makes whole batches of the recipe "
        f"for {guests} guests, just enough for everyone. How many grams of flour does the cook use?",
        batches * flour,
        f"-(-{guests} // {serves}) * {flour}",
    )


def _bus(r: random.Random) -> tuple[str, int, str]:
    start, stops = r.randint(10, 40), r.randint(3, 5)
    people, text, expression = start, [], str(start)
    for _ in range(stops):
        off, on = r.randint(0, min(people, 12)), r.randint(3, 25)
        people += on - off
        text.append(f"{off} get off and {on} get on")
        expression += f" - {off} + {on}"
    return (
        f"A bus leaves with {start} passengers. At its {stops} stops, in order: {'; '.join(text)}. How many "
        f"passengers are on the bus after the last stop?",
        people,
        expression,
    )


TEMPLATES = (
    _stock,
    _change,
    _journey,
    _packs,
    _orchard,
    _savings,
    _printer,
    _theatre,
    _garden,
    _factory,
    _recipe,
    _bus,
)

_ITEMS = (
    "apples",
    "stickers",
    "marbles",
    "books",
    "coins",
    "stamps",
    "shells",
    "cards",
    "pencils",
    "buttons",
)
_DIGITS = ((1, 1), (1, 2), (2, 2), (2, 3), (3, 3))
"""Digit counts of a one-step problem's two numbers, one pair drawn per problem."""


def _number(r: random.Random, digits: int, low: int = 2) -> int:
    return r.randint(max(low, 10 ** (digits - 1)), 10**digits - 1)


def _operands(r: random.Random) -> tuple[int, int]:
    a, b = (_number(r, d) for d in r.choice(_DIGITS))
    return (a, b) if r.random() < 0.5 else (b, a)


def _sum(r: random.Random) -> tuple[str, int, str]:
    name, item = r.choice(_NAMES), r.choice(_ITEMS)
    a, b = _operands(r)
    return (
        f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
        a + b,
        f"{a} + {b}",
    )


def _difference(r: random.Random) -> tuple[str, int, str]:
    name, item = r.choice(_NAMES), r.choice(_ITEMS)
    a, b = sorted(_operands(r), reverse=True)
    return (
        f"{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?",
        a - b,
        f"{a} - {b}",
    )


def _product(r: random.Random) -> tuple[str, int, str]:
    item = r.choice(_ITEMS)
    a, b = _operands(r)
    return (
        f"There are {a} boxes with {b} {item} in each box. How many {item} are there in all?",
        a * b,
        f"{a} * {b}",
    )


def _share(r: random.Random) -> tuple[str, int, str]:
    item = r.choice(_ITEMS)
    each, friends = _operands(r)
    return (
        f"{each * friends} {item} are shared equally among {friends} friends. How many {item} does each friend "
        f"get?",
        each,
        f"{each * friends} / {friends}",
    )


ONE_STEP_TEMPLATES = (_sum, _difference, _product, _share)


def check_level(level: str) -> str:
    if level not in LEVELS:
        raise ValueError(f"level={level!r} is not valid; choose one of: {', '.join(LEVELS)}")
    return level


def problems(split: str, seed: int = 0, level: str = "multi-step") -> list[dict]:
    """The built-in problems of `split` (train or eval) at `level` as records {"question", "answer",
    "expression"} (the answer a string of a positive integer; the expression, one the calculator of
    `math_tools` evaluates to it, the worked solution its demonstrations use): a pure function of
    (split, seed, level); eval questions never appear in train."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not valid; choose one of: {', '.join(SPLITS)}")
    check_level(level)
    held_out = {q for q, _, _ in _draw(EVAL_SIZE, seed, "eval", level)} if split == "train" else set()
    size = TRAIN_SIZE if split == "train" else EVAL_SIZE
    return [
        {"question": q, "answer": str(a), "expression": e}
        for q, a, e in _draw(size, seed, split, level, held_out)
    ]


def _draw(n: int, seed: int, split: str, level: str, skip: set = frozenset()) -> list[tuple[str, int, str]]:
    stream = split if level == "multi-step" else f"{level}/{split}"
    templates = TEMPLATES if level == "multi-step" else ONE_STEP_TEMPLATES
    rng = random.Random(f"vapo-lit/wordproblems/{VERSION}/{stream}/{seed}")
    out, seen = [], set(skip)
    while len(out) < n:
        question, answer, expression = templates[len(out) % len(templates)](rng)
        if question in seen or answer <= 0:
            continue
        seen.add(question)
        out.append((question, answer, expression))
    return out
