"""Long and short responses: how each row's advantages and loss treat response length, from the logs.

Runs log, per PPO iteration, by response-length bucket `<b>` (vapo_lit.experience):
`gae/lambda_policy_len_<b>` (mean lambda_policy of the bucket's responses), `gae/adv_bias_len_<b>`,
`gae/adv_var_len_<b>` and `gae/adv_var_mc_len_<b>` (the actor advantage before whitening against
the Monte-Carlo one: mean difference, both variances) and `policy/loss_share_len_<b>` (the bucket's
share of a mini-batch's policy-gradient weight). With the clip fractions, the entropy and the
critic's bias at the first response token, which every run logs, they give two frames:

* `mechanisms.csv`, one line per row: V(s_0) − return over the first CALIBRATION_UPDATES PPO
  iterations; lambda_policy's smallest and largest value over training; the clip fractions (mean
  over training) and the share of PPO iterations in which the upper clip bound at all; entropy over
  the first CALIBRATION_UPDATES and the last N PPO iterations.
* `by_length.csv`, one line per (row, bucket): lambda_policy (mean over training); the advantage's
  bias against Monte-Carlo and Var(A) / Var(A_mc), early (first CALIBRATION_UPDATES PPO iterations)
  and late (last N); the loss share (mean over training).

Each number is a per-run mean (a ratio of per-run means for the variance ratio), then the mean over
the row's seeds. Runs logged before these columns existed have no such section (nor these files).
"""

from __future__ import annotations

import math

import pandas as pd

from vapo_lit.report.collect import CALIBRATION_UPDATES, _col, ppo_rows

LENGTH_BUCKETS = ("lt20", "20-49", "50-99", "100-199", "200-499", "500-999", "ge1000")
"""Response-length buckets in length order (vapo_lit.experience.LENGTH_EDGES' labels)."""
SIGNATURE = ("policy/loss_share_len_", "gae/lambda_policy_len_")
"""Column prefixes whose presence in any run turns the section on."""
ROW_COLUMNS = (
    "v0_bias_early",
    "lambda_min",
    "lambda_max",
    "clipfrac_low",
    "clipfrac_high",
    "clip_high_binding",
    "entropy_early",
    "entropy_late",
)
BUCKET_COLUMNS = (
    "lambda_policy",
    "adv_bias_early",
    "adv_bias_late",
    "adv_var_ratio_early",
    "adv_var_ratio_late",
    "loss_share",
)
NAN = float("nan")


def has_mechanisms(logs) -> bool:
    return any(col.startswith(SIGNATURE) for log in logs for col in log.metrics.columns)


def _mean(xs) -> float:
    xs = [x for x in xs if x == x]
    return sum(xs) / len(xs) if xs else NAN


def _phases(series: pd.Series, last_n: int) -> dict:
    s = series.dropna()
    return {"early": s.iloc[:CALIBRATION_UPDATES], "late": s.iloc[-last_n:], "all": s}


def _run_row(ppo: pd.DataFrame, last_n: int) -> dict:
    entropy = _phases(_col(ppo, "policy/entropy"), last_n)
    high = _col(ppo, "policy/clipfrac_high").dropna()
    lam_min, lam_max = (
        _col(ppo, "gae/lambda_policy_min").dropna(),
        _col(ppo, "gae/lambda_policy_max").dropna(),
    )
    return {
        "v0_bias_early": _mean(_phases(_col(ppo, "value/bias_pos_first"), last_n)["early"]),
        "lambda_min": float(lam_min.min()) if len(lam_min) else NAN,
        "lambda_max": float(lam_max.max()) if len(lam_max) else NAN,
        "clipfrac_low": _mean(_col(ppo, "policy/clipfrac_low")),
        "clipfrac_high": _mean(high),
        "clip_high_binding": float((high > 0).mean()) if len(high) else NAN,
        "entropy_early": _mean(entropy["early"]),
        "entropy_late": _mean(entropy["late"]),
    }


def _run_bucket(ppo: pd.DataFrame, b: str, last_n: int) -> dict:
    bias = _phases(_col(ppo, f"gae/adv_bias_len_{b}"), last_n)
    rec = {
        "lambda_policy": _mean(_col(ppo, f"gae/lambda_policy_len_{b}")),
        "loss_share": _mean(_col(ppo, f"policy/loss_share_len_{b}")),
    }
    both = pd.concat(
        [_col(ppo, f"gae/adv_var_len_{b}"), _col(ppo, f"gae/adv_var_mc_len_{b}")], axis=1
    ).dropna()
    for phase in ("early", "late"):
        rec[f"adv_bias_{phase}"] = _mean(bias[phase])
        part = both.iloc[:CALIBRATION_UPDATES] if phase == "early" else both.iloc[-last_n:]
        mc = float(part.iloc[:, 1].mean()) if len(part) else NAN
        rec[f"adv_var_ratio_{phase}"] = float(part.iloc[:, 0].mean()) / mc if mc > 0 else NAN
    return rec


def mechanism_frames(logs, order: list, last_n: int) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(mechanisms, by_length) as the module docstring says; None when no run logs them."""
    if not has_mechanisms(logs):
        return None
    rows, buckets = [], []
    present = [
        b
        for b in LENGTH_BUCKETS
        if any(
            f"policy/loss_share_len_{b}" in log.metrics or f"gae/lambda_policy_len_{b}" in log.metrics
            for log in logs
        )
    ]
    for row in order:
        runs = [ppo_rows(log.metrics) for log in logs if log.row == row]
        per_run = [_run_row(ppo, last_n) for ppo in runs]
        rows.append({"row": row, "runs": len(runs), **{c: _mean(r[c] for r in per_run) for c in ROW_COLUMNS}})
        for b in present:
            per_run = [_run_bucket(ppo, b, last_n) for ppo in runs]
            buckets.append(
                {
                    "row": row,
                    "bucket": b,
                    "runs": len(runs),
                    **{c: _mean(r[c] for r in per_run) for c in BUCKET_COLUMNS},
                }
            )
    return (
        pd.DataFrame(rows, columns=["row", "runs", *ROW_COLUMNS]),
        pd.DataFrame(buckets, columns=["row", "bucket", "runs", *BUCKET_COLUMNS]),
    )


MECHANISMS_TEXT = (
    "How each row treats long and short responses (mean over seeds). V(s₀) bias: V − Monte-Carlo return at the "
    "first response token over the first {early} PPO iterations (the critic's starting point: with value "
    "pretraining, after it). λ range: the smallest and largest lambda_policy of any response. Clip low / high: "
    "the fraction of tokens whose gradient the lower / upper clip removed, mean over training; 'upper binds' = "
    "the share of PPO iterations in which the upper clip removed any token. Entropy: first {early} → last {n} "
    "PPO iterations."
)
BY_LENGTH_TEXT = (
    "By response length (tokens). λ: mean lambda_policy of the bucket's responses. Loss share: the bucket's share "
    "of each mini-batch's policy-gradient weight Σ w_t·|A_t| (w_t the token's weight in the loss: 1/tokens with "
    "the token-level loss, 1/(responses × its length) with the sample-level one), mean over training. A − A_mc: "
    "the actor advantage before whitening minus the Monte-Carlo advantage G − V (λ = 1, unbiased against the "
    "same critic), mean over the bucket's tokens, first {early} / last {n} PPO iterations; Var ratio = Var(A) / "
    "Var(A_mc) over the same iterations (below 1: λ < 1 trades variance for that bias). Critic-free rows have "
    "neither."
)


def markdown_tables(mech: pd.DataFrame, by_length: pd.DataFrame) -> list[str]:
    """The section's tables as Markdown: one per row-level table, then the length tables."""
    from vapo_lit.report.render import markdown, num
    from vapo_lit.report.table import pretty

    head = ["row", "n", "V(s₀) bias", "λ range", "clip low", "clip high", "upper binds", "entropy"]
    body = [
        [
            pretty(r["row"]),
            str(int(r["runs"])),
            num(r["v0_bias_early"], 3, signed=True),
            f"{num(r['lambda_min'], 3)}–{num(r['lambda_max'], 4)}"
            if r["lambda_min"] == r["lambda_min"]
            else num(NAN),
            _sci(r["clipfrac_low"]),
            _sci(r["clipfrac_high"]),
            _pct(r["clip_high_binding"]),
            f"{num(r['entropy_early'], 3)} → {num(r['entropy_late'], 3)}",
        ]
        for _, r in mech.iterrows()
    ]
    tables = [markdown(head, body)]
    buckets = list(dict.fromkeys(by_length["bucket"]))
    for title, fmt in (
        ("λ_policy", lambda r: num(r["lambda_policy"], 3)),
        ("loss share", lambda r: _pct(r["loss_share"])),
        (
            "A − A_mc early / late",
            lambda r: (
                f"{num(r['adv_bias_early'], 3, signed=True)} / {num(r['adv_bias_late'], 3, signed=True)}"
            ),
        ),
        (
            "Var(A)/Var(A_mc) early / late",
            lambda r: f"{num(r['adv_var_ratio_early'], 2)} / {num(r['adv_var_ratio_late'], 2)}",
        ),
    ):
        body = []
        for row in mech["row"]:
            cells = {r["bucket"]: r for _, r in by_length[by_length["row"] == row].iterrows()}
            body.append([pretty(row), *(fmt(cells[b]) for b in buckets)])
        tables.append(f"{title}, by response length:\n\n" + markdown(["row", *buckets], body))
    return tables


def _sci(x) -> str:
    return "–" if not x == x else ("0" if x == 0 else f"{x:.1e}")


def _pct(x) -> str:
    return "–" if not x == x or math.isinf(x) else f"{100 * x:.0f}%"
