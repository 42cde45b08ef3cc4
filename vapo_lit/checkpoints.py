"""Run checkpoints: last.ckpt every `checkpoint_every` iterations and at the end, best.ckpt on a
new best eval; written to a temporary file and renamed, so a kill never leaves half a checkpoint."""
from __future__ import annotations

import os
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class RunCheckpoints(Callback):
    """last.ckpt every `checkpoint_every` iterations and at the end; best.ckpt on a new best eval.
    Written to a temporary file and renamed, so a kill never leaves a half-written checkpoint."""

    def __init__(self, run_dir: Path, every: int):
        self.dir = Path(run_dir) / "checkpoints"
        self.every = every

    def _save(self, trainer, name: str) -> str:
        self.dir.mkdir(parents=True, exist_ok=True)
        final = self.dir / name
        tmp = self.dir / f".{name}.tmp"
        trainer.save_checkpoint(str(tmp), weights_only=False)  # full state: optimizers, schedulers, callbacks
        os.replace(tmp, final)
        return str(final)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        ev = pl_module.last_eval
        if ev is not None and ev.is_best and ev.iteration == pl_module.iteration:  # evaluated in this iteration
            self._save(trainer, "best.ckpt")
        if pl_module.iteration % self.every == 0 or trainer.should_stop:
            pl_module.last_good_checkpoint = self._save(trainer, "last.ckpt")
