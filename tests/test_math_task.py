"""The `math` task: local JSONL/parquet data, validation errors, split, prompts, buckets, verify."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vapo_lit.tasks import Verdict, get_task, task_names
from vapo_lit.tasks.math import MathTask, load_records

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _tokenizer(chat: bool = False):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "[PAD]", "</s>", "Question:", "Answer:", "\\boxed{42}", "####"] + [
        str(i) for i in range(10)
    ]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", eos_token="</s>"
    )
    if chat:
        out.chat_template = CHAT_TEMPLATE
    return out


@pytest.fixture(scope="module")
def tok():
    return _tokenizer()


@pytest.fixture(scope="module")
def chat_tok():
    return _tokenizer(chat=True)


GSM_ROWS = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many "
        "clips in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips.\n#### 72",
    },
    {
        "question": "Weng earns $12 an hour. Yesterday she did 50 minutes of babysitting. How much did she earn?",
        "answer": "Weng earns 12/60 = $0.2 per minute.\nShe earned 0.2 x 50 = $10.\n#### 10",
    },
    {"question": "What is 1/2 + 1/4?", "answer": "\\boxed{\\frac{3}{4}}"},
    {"question": "Simplify sin(45 degrees).", "answer": "\\frac{\\sqrt{2}}{2}"},
    {"question": "How many legs do 3 spiders have?", "answer": 24},
    {"question": "A shop sells 1,000 pens a day for 2 days. How many pens?", "answer": "#### 2,000"},
]


def _rows(n: int) -> list[dict]:
    rows = list(GSM_ROWS)
    for i in range(n - len(rows)):
        rows.append(
            {
                "question": f"What is {i} plus {i}?" + " Think." * (i % 7),
                "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}",
            }
        )
    return rows


def write_jsonl(path: Path, rows, raw_lines: list[str] | None = None) -> Path:
    lines = [json.dumps(r) for r in rows] if raw_lines is None else raw_lines
    path.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
    return path


def write_parquet(path: Path, rows) -> Path:
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    df = pd.DataFrame(rows)
    if df["answer"].map(type).nunique() > 1:  # a parquet column has one type
        df["answer"] = df["answer"].astype(str)
    df.to_parquet(path)
    return path


@pytest.fixture
def task(tmp_path, tok):
    t = MathTask(write_jsonl(tmp_path / "train.jsonl", _rows(40)), tokenizer=tok, eval_fraction=0.25, seed=3)
    yield t
    t.close()


# ------------------------------------------------------------------------------- loading
def test_jsonl_answers_gsm8k_boxed_and_bare(tmp_path):
    recs = load_records(write_jsonl(tmp_path / "d.jsonl", GSM_ROWS))
    assert [r.answer for r in recs] == ["72", "10", "\\frac{3}{4}", "\\frac{\\sqrt{2}}{2}", "24", "2,000"]
    assert recs[0].source.endswith("d.jsonl:1") and recs[4].source.endswith("d.jsonl:5")
    assert recs[0].solution.startswith("Natalia sold 48/2")


def test_parquet_numeric_answer_column(tmp_path):
    p = write_parquet(
        tmp_path / "n.parquet", [{"question": "2+2?", "answer": 4}, {"question": "1/2?", "answer": 0.5}]
    )
    assert [r.answer for r in load_records(p)] == ["4", "0.5"]


def test_parquet_same_as_jsonl(tmp_path):
    pq = load_records(write_parquet(tmp_path / "d.parquet", GSM_ROWS))
    js = load_records(write_jsonl(tmp_path / "d.jsonl", GSM_ROWS))
    assert [(r.question, r.answer) for r in pq] == [(r.question, r.answer) for r in js]


def test_custom_field_names_and_blank_lines(tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl",
        None,
        raw_lines=[
            json.dumps({"problem": "What is 2+2?", "solution": "#### 4"}),
            "",
            "   ",
            json.dumps({"problem": "What is 3+3?", "solution": "6", "extra": 1}),
        ],
    )
    recs = load_records(path, "problem", "solution")
    assert [r.answer for r in recs] == ["4", "6"]
    assert recs[1].source.endswith(":4")


BAD_JSONL = [
    # (lines, message fragments)
    (
        [json.dumps(GSM_ROWS[0]), json.dumps({"question": "q"})],
        [
            "line 2",
            "missing field 'answer'",
            "expected a JSON object with string fields 'question' and 'answer'",
            "found fields: 'question'",
        ],
    ),
    (
        [json.dumps(GSM_ROWS[0]), json.dumps(GSM_ROWS[1]), '{"question": "q", "answer": 3,}'],
        ["line 3", "invalid JSON", "expected one JSON object per line"],
    ),
    (['["question", "answer"]'], ["line 1", "got a JSON list"]),
    (['"just a string"'], ["line 1", "got a JSON str"]),
    ([json.dumps({"question": "", "answer": "1"})], ["line 1", "field 'question' is empty"]),
    (
        [json.dumps({"question": "q", "answer": None})],
        ["line 1", "field 'answer' must be a string or a number, got None"],
    ),
    (
        [json.dumps({"question": "q", "answer": [1, 2]})],
        ["line 1", "field 'answer' must be a string or a number, got list"],
    ),
    ([json.dumps({"question": "q", "answer": True})], ["line 1", "must be a string or a number"]),
    (
        [json.dumps({"question": "q", "answer": "some work\n####   "})],
        ["line 1", "no final answer", "'#### <answer>'"],
    ),
    ([], ["no records (empty file)", "expected a .jsonl file"]),
    (["", "  ", ""], ["no records (empty file)"]),
]


@pytest.mark.parametrize("lines, fragments", BAD_JSONL)
def test_malformed_jsonl_fails_with_file_line_and_expectation(tmp_path, lines, fragments, tok):
    path = write_jsonl(tmp_path / "bad.jsonl", None, raw_lines=lines)
    with pytest.raises(ValueError) as ei:
        load_records(path)
    msg = str(ei.value)
    assert str(path) in msg
    for f in fragments:
        assert f in msg, (f, msg)
    # and the task fails at construction, before anything else
    with pytest.raises(ValueError, match="bad.jsonl"):
        MathTask(path, tokenizer=tok)


def test_invalid_utf8_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(json.dumps(GSM_ROWS[0]).encode() + b'\n{"question": "\xff\xfe", "answer": "1"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2: not valid UTF-8"):
        load_records(path)


def test_exact_message_for_bad_json_line(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", None, raw_lines=[json.dumps(GSM_ROWS[1]), "{not json"])
    with pytest.raises(ValueError) as ei:
        load_records(path)
    assert str(ei.value) == (
        f"data file {path}, line 2: invalid JSON (Expecting property name enclosed in double quotes "
        f"at column 2); expected one JSON object per line, a JSON object with string fields "
        f"'question' and 'answer'"
    )


def test_missing_and_unknown_files(tmp_path, tok):
    with pytest.raises(ValueError) as ei:
        load_records(tmp_path / "nope.jsonl")
    assert str(ei.value).startswith(f"data file {tmp_path / 'nope.jsonl'}: file not found; expected a .jsonl")
    csv = tmp_path / "d.csv"
    csv.write_text("question,answer\nq,1\n")
    with pytest.raises(ValueError, match=r"d\.csv: unknown extension '\.csv'; expected .*\.jsonl.*\.parquet"):
        load_records(csv)
    with pytest.raises(ValueError, match="not a regular file"):
        load_records(tmp_path)
    with pytest.raises(ValueError, match="file not found"):
        MathTask(tmp_path / "nope.jsonl", tokenizer=tok)


def test_malformed_parquet(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    p = tmp_path / "cols.parquet"
    pd.DataFrame({"question": ["a", "b"], "solution": ["1", "2"]}).to_parquet(p)
    with pytest.raises(ValueError) as ei:
        load_records(p)
    assert str(ei.value) == (
        f"data file {p}: missing column 'answer' (expected columns 'question' and "
        f"'answer'; found columns: 'question', 'solution')"
    )
    p = tmp_path / "nulls.parquet"
    pd.DataFrame({"question": ["a", "b", "c"], "answer": ["1", None, "3"]}).to_parquet(p)
    with pytest.raises(
        ValueError, match=r"nulls\.parquet, row 2: field 'answer' must be a string or a number"
    ):
        load_records(p)
    p = tmp_path / "empty.parquet"
    pd.DataFrame({"question": pd.Series([], dtype=str), "answer": pd.Series([], dtype=str)}).to_parquet(p)
    with pytest.raises(ValueError, match=r"empty\.parquet: no records"):
        load_records(p)
    p = tmp_path / "junk.parquet"
    p.write_bytes(b"this is not parquet")
    with pytest.raises(ValueError, match=r"junk\.parquet: cannot read as parquet"):
        load_records(p)


# ------------------------------------------------------------------------------- split
def test_split_is_deterministic_and_disjoint(tmp_path, tok):
    path = write_jsonl(tmp_path / "d.jsonl", _rows(40))
    a = MathTask(path, tokenizer=tok, eval_fraction=0.25, seed=1)
    b = MathTask(path, tokenizer=tok, eval_fraction=0.25, seed=1)
    c = MathTask(path, tokenizer=tok, eval_fraction=0.25, seed=2)
    qa = [r.question for r in a.eval_records()]
    assert qa == [r.question for r in b.eval_records()]
    assert set(qa) != {r.question for r in c.eval_records()}
    for t in (a, c):
        train_q = {r.question for r in t.train_records()}
        eval_q = {r.question for r in t.eval_records()}
        assert not train_q & eval_q
        assert len(train_q) + len(eval_q) == 40 and len(eval_q) == 10
        assert not {p.prompt for p in t.train_problems(200, seed=0)} & {p.prompt for p in t.eval_problems()}


def test_duplicate_questions_stay_on_one_side(tmp_path, tok):
    rows = _rows(12) + _rows(12)  # every question twice
    t = MathTask(write_jsonl(tmp_path / "d.jsonl", rows), tokenizer=tok, eval_fraction=0.3, seed=0)
    assert not {r.question for r in t.train_records()} & {r.question for r in t.eval_records()}
    assert t.n_train + t.n_eval == 24


def test_eval_file_and_overlap_removed(tmp_path, tok):
    train = write_jsonl(tmp_path / "train.jsonl", _rows(20))
    ev = write_parquet(tmp_path / "eval.parquet", _rows(20)[:3] + [{"question": "New q?", "answer": "5"}])
    t = MathTask(train, eval_path=ev, tokenizer=tok)
    assert t.n_eval == 4 and t.n_train == 17
    assert [p.answer for p in t.eval_problems()] == ["72", "10", "\\frac{3}{4}", "5"]
    with pytest.raises(ValueError, match="nothing left to train on"):
        MathTask(write_jsonl(tmp_path / "small.jsonl", _rows(20)[:3]), eval_path=ev, tokenizer=tok)


def test_too_few_questions_to_split(tmp_path, tok):
    with pytest.raises(ValueError, match="need at least 2"):
        MathTask(write_jsonl(tmp_path / "one.jsonl", GSM_ROWS[:1] * 3), tokenizer=tok)


def test_train_problems_pure_function_of_seed(task):
    a = [p.prompt for p in task.train_problems(70, seed=5)]
    assert a == [p.prompt for p in task.train_problems(70, seed=5)]
    assert a != [p.prompt for p in task.train_problems(70, seed=6)]
    assert len(a) == 70 and len(set(a)) == task.n_train  # 70 > 30 train problems: full epochs


# ------------------------------------------------------------------------------- prompts, tokenizer
def test_plain_prompt(task):
    p = task.eval_problems()[0]
    q = task.eval_records()[0].question
    assert p.prompt == f"Question: {q}\nAnswer:"


def test_chat_template_prompt(tmp_path, chat_tok):
    t = MathTask(write_jsonl(tmp_path / "d.jsonl", _rows(10)), tokenizer=chat_tok, seed=0)
    q = t.eval_records()[0].question
    assert t.eval_problems()[0].prompt == (
        f"<|user|>\n{q}\nPlease reason step by step, and put your final answer within \\boxed{{}}.\n"
        f"<|assistant|>\n"
    )


def test_tokenizer_from_local_path(tmp_path, chat_tok):
    d = tmp_path / "tok"
    chat_tok.save_pretrained(d)
    t = MathTask(write_jsonl(tmp_path / "d.jsonl", _rows(10)), tokenizer=str(d))
    assert t.tokenizer.chat_template == CHAT_TEMPLATE
    assert t.eval_problems()[0].prompt.startswith("<|user|>\n")
    with pytest.raises(ValueError, match="not a local directory"):
        MathTask(tmp_path / "d.jsonl", tokenizer=str(tmp_path / "no_such_dir"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="cannot load a tokenizer"):
        MathTask(tmp_path / "d.jsonl", tokenizer=tmp_path / "empty")
    with pytest.raises(ValueError, match="needs a tokenizer"):
        MathTask(tmp_path / "d.jsonl")


def test_broken_chat_template_fails_at_construction(tmp_path):
    bad = _tokenizer()
    bad.chat_template = "{% for m in messages %}{{ m['content'] | no_such_filter }}{% endfor %}"
    with pytest.raises(ValueError, match="chat template"):
        MathTask(write_jsonl(tmp_path / "d.jsonl", _rows(10)), tokenizer=bad)


# ------------------------------------------------------------------------------- buckets
def test_buckets_by_question_length(task):
    names = task.bucket_names()
    assert len(names) == 3 and all(n.startswith("qlen") for n in names)
    los = [int(n[4:].split("-")[0]) for n in names]
    assert los == sorted(los)
    probs = task.eval_problems() + task.train_problems(30, seed=0)
    assert all(task.bucket(p) in names for p in probs)
    for p in probs:  # a bucket's label holds its problem's question length
        lo, hi = (int(x) for x in task.bucket(p)[4:].split("-"))
        assert lo <= p.meta["length"] <= hi
    assert len({task.bucket(p) for p in probs}) == 3


def test_buckets_by_solution_length(tmp_path, tok):
    t = MathTask(
        write_jsonl(tmp_path / "d.jsonl", _rows(30)), tokenizer=tok, bucket_by="solution", n_buckets=4
    )
    names = t.bucket_names()  # tied lengths can merge quantile buckets
    assert all(n.startswith("slen") for n in names) and 2 <= len(names) <= 4
    assert all(t.bucket(p) in names for p in t.eval_problems())
    with pytest.raises(ValueError, match="bucket_by"):
        MathTask(tmp_path / "d.jsonl", tokenizer=tok, bucket_by="tokens")


# ------------------------------------------------------------------------------- verify
def test_verify(task):
    p = next(p for p in task.eval_problems() + task.train_problems(40, seed=0) if p.answer == "72")
    assert task.verify(p, "48/2 = 24, 48 + 24 = 72.\n#### 72") == Verdict(1.0)
    assert task.verify(p, "So the total is \\boxed{72}.") == Verdict(1.0)
    assert task.verify(p, "The answer is 72 clips.") == Verdict(1.0)  # a trailing unit word
    assert task.verify(p, "The answer is 72 or 73.") == Verdict(0.0)  # hedging
    assert task.verify(p, "The answer is $72$.") == Verdict(1.0)
    assert task.verify(p, "48 + 24 = 72 but \\boxed{71}") == Verdict(0.0)
    assert task.verify(p, " 72\n\nQuestion: What is 5+5?\nAnswer: 10") == Verdict(1.0)  # plain format
    assert task.verify(p, " 10\n\nQuestion: What is 36+36?\nAnswer: 72") == Verdict(0.0)
    assert task.verify(p, "") == Verdict(0.0)
    assert task.verify(p, "</s>") == Verdict(0.0)


def test_verify_batch_symbolic_and_numeric(tmp_path, tok):
    t = MathTask(write_jsonl(tmp_path / "d.jsonl", GSM_ROWS), tokenizer=tok, verify_workers=2)
    try:
        probs = {
            r.answer: p
            for r, p in zip(
                t.train_records() + t.eval_records(),
                [t._problem(r) for r in t.train_records() + t.eval_records()],
            )
        }
        cases = [
            (probs["\\frac{3}{4}"], "\\boxed{0.75}", 1.0),
            (probs["\\frac{\\sqrt{2}}{2}"], "\\boxed{\\sqrt{2}/2}", 1.0),
            (probs["\\frac{\\sqrt{2}}{2}"], "\\boxed{\\sqrt{3}/2}", 0.0),
            (probs["2,000"], "#### 2000", 1.0),
            (probs["24"], "\\boxed{24.0}", 1.0),
            (probs["10"], "\\boxed{\\$10}", 1.0),
        ]
        got = t.verify_batch([c[0] for c in cases], [c[1] for c in cases])
        assert [v.reward for v in got] == [c[2] for c in cases]
        assert all(v.error is None for v in got)
    finally:
        t.close()


def test_verify_timeout_is_reported(tmp_path, tok):
    t = MathTask(write_jsonl(tmp_path / "d.jsonl", _rows(10)), tokenizer=tok, verify_timeout=1.0)
    try:
        p = t.eval_problems()[0]
        v = t.verify(p, "\\boxed{9^{9^{9^{9}}}}")
        assert v.reward == 0.0 and v.error.startswith("timeout:")
    finally:
        t.close()


def test_registry(tmp_path, tok):
    assert "math" in task_names()
    t = get_task("math", train_path=write_jsonl(tmp_path / "d.jsonl", _rows(10)), tokenizer=tok)
    assert isinstance(t, MathTask) and t.name == "math" and t.version.startswith("1/math-verify-")
    assert t.max_new_tokens == 1024


def test_task_pickles_without_its_workers(task):
    import pickle

    p = task.eval_problems()[0]
    assert task.verify(p, f"\\boxed{{{p.answer}}}") == Verdict(1.0)
    clone = pickle.loads(pickle.dumps(task))
    try:
        assert clone.verify(p, f"\\boxed{{{p.answer} + 0}}") == Verdict(1.0)  # via the CAS workers
        assert [q.prompt for q in clone.train_problems(5, seed=1)] == [
            q.prompt for q in task.train_problems(5, seed=1)
        ]
    finally:
        clone.close()
