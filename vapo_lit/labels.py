"""Row labels: the one name of a component set (run folders, W&B job types, report rows), the
paper's row order, and pairs of rows to contrast. Plain functions of the component names."""

from __future__ import annotations

from vapo_lit.config import COMPONENTS, OPTIONAL_COMPONENTS


def run_label(
    components, advantage_estimator: str = "gae", observations: str = "skip", gae_values: str = "critic"
) -> str:
    """The one name of a component set, used for run folders, W&B job types and report rows:
    'vapo' (all seven), 'vanilla_ppo' (none), 'vapo-no-a+b' (up to three dropped),
    'ppo+a+b' (more dropped), 'grpo+a+b' (the critic-free estimator); optional components on
    are added as '-with-x+y'; GAE's observation treatment other than the default skip as
    '-obs-step' / '-obs-zero' (multi-turn tasks); GAE on the task's true values as '-oracle'."""
    on = [c for c in COMPONENTS if c in components]
    extras = [c for c in OPTIONAL_COMPONENTS if c in components]
    if advantage_estimator == "grpo":
        label = "grpo+" + "+".join(on)
    elif len(on) == len(COMPONENTS):
        label = "vapo"
    elif not on:
        label = "vanilla_ppo"
    else:
        dropped = [c for c in COMPONENTS if c not in on]
        label = "vapo-no-" + "+".join(dropped) if len(dropped) <= 3 else "ppo+" + "+".join(on)
    label += "-with-" + "+".join(extras) if extras else ""
    label += f"-obs-{observations}" if observations != "skip" else ""
    return label + ("-oracle" if gae_values == "oracle" else "")


def label_of(cfg) -> str:
    """`run_label` of a run's config."""
    return run_label(cfg.components, cfg.advantage_estimator, cfg.observations, cfg.gae_values)


def row_order(components, advantage_estimator: str = "gae", label: str = "") -> tuple:
    """Sort key in the paper's order: full VAPO, single drops (COMPONENTS order), joint drops,
    vanilla PPO, critic-free rows; a row with optional components right after its base row."""
    dropped = tuple(COMPONENTS.index(c) for c in COMPONENTS if c not in components)
    extras = tuple(OPTIONAL_COMPONENTS.index(c) for c in OPTIONAL_COMPONENTS if c in components)
    if advantage_estimator == "grpo":
        return (4, dropped, extras, label)
    if not dropped:
        return (0, (), extras, label)
    if len(dropped) == len(COMPONENTS):
        return (3, (), extras, label)
    return (1 if len(dropped) == 1 else 2, (len(dropped), dropped), extras, label)


def check_contrasts(pairs: list, rows: list, where: str) -> list[tuple[str, str]]:
    """A grid's or a report's contrasts ([row, against] pairs) as tuples, each label a row (`rows`),
    no pair twice; ValueError naming `where`."""
    out = []
    for pair in pairs:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise ValueError(f"{where}: a contrast is a pair [row, against] of row labels; got {pair!r}")
        bad = [x for x in pair if x not in rows]
        if bad:
            raise ValueError(
                f"{where}: contrast {list(pair)}: {', '.join(map(repr, bad))} is not a row; "
                f"rows: {', '.join(rows)}"
            )
        if pair[0] == pair[1]:
            raise ValueError(f"{where}: contrast {list(pair)} compares a row with itself")
        if tuple(pair) in out or tuple(pair[::-1]) in out:
            raise ValueError(
                f"{where}: contrast {list(pair)} is given twice (a reversed pair is the same test)"
            )
        out.append(tuple(pair))
    return out
