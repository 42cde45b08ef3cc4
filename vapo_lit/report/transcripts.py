"""What the model wrote, in the report: episodes from the runs' `samples.jsonl` (vapo_lit/samples.py).

For each row, the run of its lowest seed that kept samples: from its first eval (the policy before
any update) and its last eval, the first episode the verifier rewarded and the first it did not, where
that eval has one, with the prompt's tail, the response as the model wrote it (observations included,
for multi-turn episodes), the reward and the number of tool calls. Rows whose runs kept no samples are
left out; a grid where none did has no section.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from vapo_lit.sample_lines import read_rows

FILE = "samples.jsonl"
PROMPT_TAIL = 320
"""Characters of the prompt shown (its end: the question and the generation prompt)."""
RESPONSE_CHARS = 1200
"""Characters of a response shown; a longer one is cut and says by how much."""
TEXT = (
    "What the model wrote at its first and its last eval, for the lowest seed of each row that kept samples "
    "(`samples.jsonl` in the run folder holds them all): the first episode the verifier rewarded and the first "
    "it did not, where the eval has one; each prompt is shown by its last {tail} characters."
)


def read_samples(run_dir: Path) -> list[dict]:
    """The run's complete sample rows ([] when it kept none)."""
    path = Path(run_dir) / FILE
    return read_rows(path) if path.is_file() else []


def pick(rows: list[dict]) -> list[dict]:
    """The first and the last eval's first rewarded and first unrewarded episodes, in that order."""
    evals = [r for r in rows if r.get("phase") == "eval"]
    if not evals:
        return []
    updates = sorted({int(r["ppo_update"]) for r in evals})
    chosen = []
    for update in dict.fromkeys((updates[0], updates[-1])):
        at = sorted((r for r in evals if int(r["ppo_update"]) == update), key=lambda r: int(r["index"]))
        for rewarded in (True, False):
            first = next((r for r in at if (float(r["reward"]) > 0) == rewarded), None)
            chosen += [first] if first is not None else []
    return chosen


def transcript_frame(logs, order) -> pd.DataFrame | None:
    """One line per episode shown: row, seed, run, PPO update, reward, tool calls, prompt tail, response."""
    out = []
    for row in order:
        for log in sorted((lg for lg in logs if lg.row == row), key=lambda lg: lg.seed):
            picked = pick(read_samples(log.run_dir))
            if picked:
                out += [
                    {
                        "row": row,
                        "seed": log.seed,
                        "run": log.run_dir.name,
                        "ppo_update": int(r["ppo_update"]),
                        "reward": float(r["reward"]),
                        "tool_calls": len(r.get("tool_calls") or []),
                        "prompt_tail": r["prompt"][-PROMPT_TAIL:],
                        "response": r["response"],
                    }
                    for r in picked
                ]
                break
    return pd.DataFrame(out) if out else None


def _block(text: str) -> str:
    fence = "~~~"
    while fence in text:
        fence += "~"
    return f"{fence}text\n{text}\n{fence}"


def markdown(frame: pd.DataFrame, pretty) -> str:
    parts = []
    for _, r in frame.iterrows():
        response = r["response"]
        cut = len(response) - RESPONSE_CHARS
        shown = response[:RESPONSE_CHARS] + (f"\n[... {cut} more characters]" if cut > 0 else "")
        calls = int(r["tool_calls"])
        parts.append(
            f"**{pretty(r['row'])}**, seed {int(r['seed'])}, eval at update {int(r['ppo_update'])}: "
            f"reward {r['reward']:g}, {calls} tool call{'' if calls == 1 else 's'}\n\n"
            f"Prompt (end):\n\n{_block('…' + r['prompt_tail'])}\n\nResponse:\n\n{_block(shown)}"
        )
    return "\n\n".join(parts)
