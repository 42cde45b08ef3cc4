"""vapo-sweep: hyperparameter search with Optuna (TPE by default, seeded), pruning on eval score.

A sweep file (sweeps/NAME.yaml):

    study: vapo_alpha              # study name in the storage (rerun = continue)
    preset: default                # base settings, then `base:` deltas, then command-line flags
    base: {steps: 60}
    objective: best                # best | final eval avg@k of the trial's run (higher is better)
    n_trials: 30                   # trials in COMPLETE or PRUNED state to reach, over all workers
    sampler: {name: tpe, seed: 0}  # tpe | random (+ their Optuna options)
    pruner: {name: median, n_warmup_steps: 10}   # median | percentile | threshold | hyperband | none
    space:                         # config paths -> distributions
      vapo.alpha: {type: float, low: 0.05, high: 4.0, log: true}
      vapo.value_pretrain_steps: {type: int, low: 5, high: 50}
      ppo.top_p: {type: categorical, choices: [0.7, 1.0]}
    enqueue:                       # optional: parameter sets tried first (e.g. the preset's values)
      - {vapo.alpha: 1.0, vapo.value_pretrain_steps: 20}

Each trial is one `train()` run in OUT/trials/<study>-t<number>/; eval avg@k is reported to the
trial at every eval (step = PPO update) and a pruned trial stops there (state PRUNED, its logs
kept). Storage: Optuna RDB with heartbeats; a trial whose worker died is retried by Optuna's
retry-stale-trial callback and resumes from its run folder's last checkpoint. Look at it with
`optuna-dashboard sqlite:///OUT/sweeps.db` (pip install optuna-dashboard), or in W&B: the study
run (ablate/study_run.py) holds the trials table, the best trial and the parameter importances.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from vapo_lit.config import RunConfig, field_paths, merge, nest, to_dict, validate

KINDS = ("float", "int", "categorical")
PRUNERS = ("median", "percentile", "threshold", "hyperband", "none")
SAMPLERS = ("tpe", "random")


@dataclass
class SweepSpec:
    study: str
    space: dict
    n_trials: int = 20
    objective: str = "best"
    preset: str = "default"
    base: dict = field(default_factory=dict)
    sampler: dict = field(default_factory=lambda: {"name": "tpe", "seed": 0})
    pruner: dict = field(default_factory=lambda: {"name": "median"})
    enqueue: list = field(default_factory=list)


def available_sweeps() -> list[str]:
    """Names of the sweeps `load_sweep` finds by name: ./sweeps/*.yaml, then the shipped ones."""
    from vapo_lit.ablate.grid import definition_dirs

    return sorted({p.stem for d in definition_dirs("sweeps") for p in d.glob("*.yaml")})


def sweep_path(name_or_path) -> Path:
    """An existing file by its path, else a sweep by name (./sweeps/NAME.yaml first, then the shipped
    `sweeps/NAME.yaml`, see `vapo_lit.ablate.grid.definition_dirs`); ValueError listing the names."""
    from vapo_lit.ablate.grid import definition_dirs

    path = Path(name_or_path)
    if path.is_file():
        return path
    if len(path.parts) == 1:  # a bare name, not a path that is missing
        for d in definition_dirs("sweeps"):
            if (d / f"{path.name}.yaml").is_file():
                return d / f"{path.name}.yaml"
    raise ValueError(
        f"{name_or_path}: no such sweep file or shipped sweep; shipped sweeps: "
        f"{', '.join(available_sweeps()) or '(none)'}"
    )


def load_sweep(name_or_path) -> SweepSpec:
    """Read and check a sweep file, given by path or by name (ValueError naming what is wrong and what is valid)."""
    path = sweep_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({e})") from None
    allowed = set(SweepSpec.__dataclass_fields__)
    bad = set(data) - allowed
    if bad:
        raise ValueError(f"{path}: unknown key(s) {sorted(bad)}; valid: {', '.join(sorted(allowed))}")
    data.setdefault("study", path.stem)
    spec = SweepSpec(**data)
    paths = field_paths()
    if not spec.space:
        raise ValueError(f"{path}: empty search space")
    for name, dist in spec.space.items():
        if name not in paths:
            raise ValueError(
                f"{path}: space key {name!r} is not a config field (e.g. vapo.alpha, ppo.critic_lr)"
            )
        kind = (dist or {}).get("type")
        if kind not in KINDS:
            raise ValueError(f"{path}: {name}: type must be one of {', '.join(KINDS)}")
        if kind == "categorical" and not dist.get("choices"):
            raise ValueError(f"{path}: {name}: categorical needs choices")
        if kind != "categorical" and not ("low" in dist and "high" in dist and dist["low"] <= dist["high"]):
            raise ValueError(f"{path}: {name}: needs low <= high")
    if spec.objective not in ("best", "final"):
        raise ValueError(f"{path}: objective must be best or final")
    if spec.sampler.get("name", "tpe") not in SAMPLERS:
        raise ValueError(f"{path}: sampler.name must be one of {', '.join(SAMPLERS)}")
    if spec.pruner.get("name", "median") not in PRUNERS:
        raise ValueError(f"{path}: pruner.name must be one of {', '.join(PRUNERS)}")
    if spec.n_trials < 1:
        raise ValueError(f"{path}: n_trials must be >= 1")
    for params in spec.enqueue:
        unknown = set(params) - set(spec.space)
        if unknown:
            raise ValueError(f"{path}: enqueue entry has keys outside the space: {sorted(unknown)}")
    return spec


def make_sampler(spec: SweepSpec):
    import optuna

    opts = {k: v for k, v in spec.sampler.items() if k != "name"}
    return {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler}[
        spec.sampler.get("name", "tpe")
    ](**opts)


def make_pruner(spec: SweepSpec):
    import optuna

    opts = {k: v for k, v in spec.pruner.items() if k != "name"}
    name = spec.pruner.get("name", "median")
    return {
        "median": optuna.pruners.MedianPruner,
        "percentile": optuna.pruners.PercentilePruner,
        "threshold": optuna.pruners.ThresholdPruner,
        "hyperband": optuna.pruners.HyperbandPruner,
        "none": optuna.pruners.NopPruner,
    }[name](**opts)


def suggest(trial, space: dict) -> dict:
    out = {}
    for name, d in space.items():
        if d["type"] == "float":
            out[name] = trial.suggest_float(
                name, d["low"], d["high"], log=d.get("log", False), step=d.get("step")
            )
        elif d["type"] == "int":
            out[name] = trial.suggest_int(
                name, d["low"], d["high"], log=d.get("log", False), step=d.get("step", 1)
            )
        else:
            out[name] = trial.suggest_categorical(name, d["choices"])
    return out


def prune_callback(trial, k: int):
    """Lightning callback: report eval avg@k at each eval (step = PPO update); prune when told."""
    import optuna
    from lightning.pytorch.callbacks import Callback

    key = f"eval/avg@{k}"

    class PruneOnEval(Callback):
        def __init__(self):
            self.reported = set()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            ev = pl_module.last_eval
            if (
                ev is None
                or ev.iteration != pl_module.iteration
                or ev.ppo_update < 1
                or ev.ppo_update in self.reported
            ):
                return  # no eval in this iteration (the base policy's eval is not reported)
            self.reported.add(ev.ppo_update)
            trial.report(ev.score, ev.ppo_update)
            if trial.should_prune():
                raise optuna.TrialPruned(f"{key}={ev.score:.4f} at PPO update {ev.ppo_update}")

    return PruneOnEval()


def run_dir_of_trial(out: Path, study: str, trial) -> tuple[Path, str]:
    """OUT/trials/<study>-t<n>, n = the first attempt's number (a retried trial resumes its folder)."""
    root = trial.study._storage.get_trial(trial._trial_id).system_attrs.get("failed_trial")
    return Path(out) / "trials", f"{study}-t{trial.number if root is None else root}"


def trained_evals(run_dir: Path, k: int) -> list[float]:
    """eval/avg@k of every eval after training started (the base policy's step-0 row left out)."""
    import csv
    import math

    key, out = f"eval/avg@{k}", []
    with open(Path(run_dir) / "metrics.csv", newline="") as f:
        for row in csv.DictReader(f):
            value = row.get(key) or ""
            if value and row.get("step") not in ("0", "0.0") and not math.isnan(float(value)):
                out.append(float(value))
    return out


def objective_fn(spec: SweepSpec, base: RunConfig, out: Path):
    from vapo_lit.train import train

    def objective(trial) -> float:
        params = suggest(trial, spec.space)
        runs, name = run_dir_of_trial(out, spec.study, trial)
        cfg = merge(
            base,
            {
                **nest(params),
                "out_dir": str(runs),
                "name": name,
                "wandb_group": spec.study,
                "wandb_job_type": "trial",
            },
        )
        validate(cfg)
        trial.set_user_attr("run_dir", str(runs / name))
        resume = (runs / name / "checkpoints" / "last.ckpt").is_file()
        if not resume and (runs / name / "metrics.csv").exists():
            import shutil

            (runs / ".partial").mkdir(parents=True, exist_ok=True)
            shutil.move(str(runs / name), str(runs / ".partial" / f"{name}-t{trial.number}"))
        train(cfg, resume=resume, extra_callbacks=[prune_callback(trial, cfg.eval_k)])
        evals = trained_evals(runs / name, cfg.eval_k)
        if not evals:
            raise RuntimeError("the run logged no eval after training (set eval_every or steps)")
        return max(evals) if spec.objective == "best" else evals[-1]

    return objective


def _open_study(spec: SweepSpec, base: RunConfig, rdb):
    """The sweep's Optuna study on storage `rdb`, created (with its enqueued trials and the base
    config) or continued."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        storage=rdb,
        study_name=spec.study,
        sampler=make_sampler(spec),
        pruner=make_pruner(spec),
        direction="maximize",
        load_if_exists=True,
    )
    if not study.trials:
        for params in spec.enqueue:
            study.enqueue_trial(params)
        study.set_user_attr("base_config", to_dict(base))
    return study


def run_sweep(
    spec: SweepSpec,
    base: RunConfig,
    out,
    storage: str | None = None,
    *,
    n_trials: int | None = None,
    heartbeat_interval: int = 10,
    grace_period: int = 60,
    retries: int = 2,
    log=print,
):
    """Create or continue the study and run trials until n_trials are COMPLETE or PRUNED."""
    from optuna.study import MaxTrialsCallback
    from optuna.trial import TrialState

    from vapo_lit.ablate.store import mask_url, open_storage

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    url = storage or f"sqlite:///{(out / 'sweeps.db').resolve()}"
    study = _open_study(spec, base, open_storage(url, heartbeat_interval, grace_period, retries))
    target = n_trials or spec.n_trials
    counted = (TrialState.COMPLETE, TrialState.PRUNED)
    done = len(study.get_trials(deepcopy=False, states=counted))
    log(
        f"[{spec.study}] {done}/{target} trials finished · storage {mask_url(url)} · "
        f"optuna-dashboard {mask_url(url)}"
    )
    if done < target:
        study.optimize(
            objective_fn(spec, base, out),
            n_trials=None,
            catch=(Exception,),
            gc_after_trial=True,
            callbacks=[
                MaxTrialsCallback(target, states=counted),
                lambda s, t: log(
                    f"[{spec.study}] trial {t.number}: {t.state.name} value={t.value} params={t.params}"
                ),
            ],
        )
    _report_best(study, spec, base, out, log)
    return study


def _report_best(study, spec: SweepSpec, base: RunConfig, out: Path, log) -> None:
    """After the trials: the best complete trial in one line, and the study's W&B run."""
    from optuna.trial import TrialState

    from vapo_lit.ablate.study_run import log_study

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if complete:
        best = max(complete, key=lambda t: t.value)
        log(
            f"[{spec.study}] best trial {best.number}: eval avg@k {spec.objective} = {best.value:.4f} "
            f"params {best.params} run {best.user_attrs.get('run_dir')}"
        )
    try:
        line = log_study(study, spec, base, out)
    except Exception as e:  # noqa: BLE001 - the trials are stored; W&B trouble must not fail the sweep
        line = f"[{spec.study}] W&B study run not logged: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if line:
        log(line)
