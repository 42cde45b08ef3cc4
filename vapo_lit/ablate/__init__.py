"""Ablation grids over seeds on an Optuna RDB store: run by `vapo-ablate` (vapo_lit/cli/ablate.py).

grid.py      rows x seeds -> cells (identity hash, run folder), ablations/*.yaml loading
store.py     one Optuna study; atomic cell claims, heartbeats, retries (see its doc)
worker.py    the worker loop: claim, train() or resume, record, progress
runner.py    plan (validate, write nothing) and run (enqueue, local workers, report)
progress.py  the progress line (done / running / waiting / failed, ETA)
sweep.py     vapo-sweep: Optuna hyperparameter search with pruning on eval score
"""
