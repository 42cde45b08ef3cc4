"""What `vapo-train` shows while it runs: one status line per iteration.

    vapo-s0  it 37/120  ppo 17/100  phase ppo  score 0.62  eval avg@8 0.55 @10  EV 0.31  2.4 s/it  ETA 3m20s

In a terminal it is ONE line, redrawn in place (carriage return); when stdout is not a terminal
(a log file, a pipe, CI) it is a plain line every `every` iterations (default: about 20 lines per
run) and at each evaluation and at the end. Off unless the `vapo-train` command turns it on
(`enabled()`), so grids, sweeps and tests print nothing per iteration; VAPO_LIT_PROGRESS=0/1 overrides.
`enabled()` turns on the status lines of `vapo_lit.status` as well: before the first iteration
ends, `StartLines` says that the initial policy is being evaluated and the first iteration sampled.
"""

from __future__ import annotations

import math
import os
import sys
import time
from contextlib import contextmanager

from lightning.pytorch.callbacks import Callback

from vapo_lit import status
from vapo_lit.status import ENV  # noqa: F401  (the switch of both: VAPO_LIT_PROGRESS)

_enabled = False


@contextmanager
def enabled(on: bool = True):
    """The status line and the status lines (vapo_lit.status) on (for `vapo-train`) inside the block."""
    global _enabled
    before, _enabled = _enabled, on
    try:
        with status.announcing(on):
            yield
    finally:
        _enabled = before


def is_enabled() -> bool:
    env = status.env_setting()
    return _enabled if env is None else env


def quiet_libraries() -> None:
    """Keep the terminal for the status line: no Lightning banners and tips, no transformers
    progress bars for saving a few MB, no deprecation notices from inside libraries."""
    import logging
    import warnings

    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="lightning")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def _pretraining(pl_module) -> bool:
    """In the critic-only value-pretraining phase (the module's `pretrain.active`)."""
    phase = getattr(pl_module, "pretrain", None)
    return bool(getattr(phase, "active", False))


def total_iterations(cfg) -> int:
    """PPO updates plus the value-pretraining iterations (at most) before them."""
    return cfg.steps + (cfg.vapo.value_pretrain_steps if "value_pretraining" in cfg.components else 0)


def fmt_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _num(x, fmt: str = ".2f") -> str:
    return format(float(x), fmt) if isinstance(x, (int, float)) and math.isfinite(float(x)) else "-"


class ProgressLine(Callback):
    """The status line (module doc). `stream` defaults to stdout; `every` to about 20 plain lines per run."""

    def __init__(self, stream=None, every: int | None = None):
        self.stream, self.every = stream, every
        self.on = False
        self.t0 = self.it0 = None
        self.last_eval = None  # (value, PPO update)
        self.width = 0
        self.tty = False

    @property
    def out(self):
        return self.stream or sys.stdout

    def on_train_start(self, trainer, pl_module) -> None:
        self.on = is_enabled() and trainer.is_global_zero  # one line per run, not one per rank
        self.t0, self.it0 = time.perf_counter(), pl_module.iteration
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        if self.every is None:
            self.every = max(1, self._total(pl_module) // 20)

    def _total(self, pl_module) -> int:
        return total_iterations(pl_module.cfg)

    def line(self, pl_module) -> str:
        cfg, m = pl_module.cfg, pl_module.last_metrics or {}
        ev = getattr(pl_module, "last_eval", None)  # EvalResult: score, ppo_update (the base policy's at 0)
        if ev is not None:
            self.last_eval = (ev.score, ev.ppo_update)
        done = pl_module.iteration - self.it0
        per_it = (time.perf_counter() - self.t0) / done if done > 0 else float("nan")
        pretraining = _pretraining(pl_module)
        pre_left = max(0, cfg.vapo.value_pretrain_steps - pl_module.iteration) if pretraining else 0
        left = cfg.steps - pl_module.ppo_updates + pre_left
        shown = "-" if self.last_eval is None else f"{_num(self.last_eval[0])} @{self.last_eval[1]}"
        name = os.path.basename(str(getattr(pl_module.trainer, "default_root_dir", "")) or "run")
        return (
            f"{name}  it {pl_module.iteration}/{self._total(pl_module)}  ppo {pl_module.ppo_updates}/{cfg.steps}  "
            f"phase {'value-pretrain' if pretraining else 'ppo'}  score {_num(m.get('objective/score'))}  "
            f"eval avg@{cfg.eval_k} {shown}  EV {_num(m.get('value/explained_variance'))}  "
            f"{_num(per_it, '.1f')} s/it  ETA {fmt_eta(per_it * left)}"
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.on:
            return
        text = self.line(pl_module)
        ev = getattr(pl_module, "last_eval", None)
        evaluated = ev is not None and ev.iteration == pl_module.iteration
        if self.tty:
            pad = max(0, self.width - len(text))
            self.width = len(text)
            self.out.write("\r" + text + " " * pad)
            self.out.flush()
        elif pl_module.iteration % self.every == 0 or trainer.should_stop or evaluated:
            print(text, file=self.out, flush=True)

    def _end_line(self) -> None:
        if self.on and self.tty and self.width:
            self.out.write("\n")
            self.out.flush()
            self.width = 0

    def on_train_end(self, trainer, pl_module) -> None:
        self._end_line()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._end_line()  # an error message starts on a line of its own


class StartLines(Callback):
    """Status lines (vapo_lit.status) for the slow steps before the first status line: the initial
    policy's evaluation, and the first iteration of this process (its line comes when it ends)."""

    def __init__(self):
        self.first = True

    def on_train_start(self, trainer, pl_module) -> None:
        if (
            trainer.ckpt_path is None
        ):  # the module evaluates the initial policy next (a resumed run did before)
            k = pl_module.cfg.eval_k
            status.say(
                f"evaluating the initial policy: {len(pl_module.eval_set)} problems x {k} "
                f"sample{'s' if k != 1 else ''}, up to {pl_module.max_new_tokens} new tokens each"
            )

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.first:
            self.first = False
            update = "the critic update (value pretraining)" if _pretraining(pl_module) else "the PPO update"
            status.say(
                f"iteration {pl_module.iteration + 1}/{total_iterations(pl_module.cfg)}: sampling "
                f"{pl_module.cfg.ppo.responses_per_step} responses, then {update}"
            )
