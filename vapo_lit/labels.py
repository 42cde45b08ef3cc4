"""Row labels: the one name of a component set (run folders, W&B job types, report rows) and the
paper's row order. Plain functions of the component names."""
from __future__ import annotations

from vapo_lit.config import COMPONENTS, OPTIONAL_COMPONENTS


def run_label(components, advantage_estimator: str = "gae", observations: str = "skip", gae_values: str = "critic") -> str:
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
