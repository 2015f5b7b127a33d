"""Hyperparameter searches: what a run is worth to a sweeper, and the pruning of a sweep's jobs.

* :func:`excluded` – why a run's value should not count in a search (``search.exclude_no_trades``:
  a trading run whose kept weights never trade on the validation split; a pruned run), else None.
  :func:`foxdqn.job.run.objective` then returns NaN, which Optuna records as a failed trial, never
  the best one, and the report lists the job with that status.
* :class:`MedianTrialPruner` – ``search.pruner=median``: Optuna's :class:`optuna.pruners.MedianPruner`
  fed by the validation evaluations during training (``eval.interval_env_steps``) of the jobs of
  one ``--multirun``.

Why not Optuna's own trial API: hydra-optuna-sweeper asks Optuna for trials in the sweeping
process and hands the launcher only their overrides; a job never sees its ``optuna.Trial``, so it
cannot call ``trial.report`` / ``trial.should_prune``, and the sweeper has no pruner setting.
Instead each job writes its validation values into ``<sweep folder>/.pruning/<job>.json``
(atomically) and, at each validation, asks a ``MedianPruner`` about an in-memory study made of the
finished jobs' files: the same rule (prune when the job's best value so far is worse than the
median of the finished jobs' values at the same env step, after ``n_startup_trials`` finished jobs
and ``n_warmup_steps`` env steps), decided by Optuna's code. Works with any launcher whose jobs
share the sweep folder's file system. A pruned job stops training, is evaluated and reported as
usual, and returns NaN (Optuna: a failed trial; the sweeper cannot mark it pruned). A member of a
population (``hydra/launcher=population``) has a pruner of its own (:func:`member_pruner`: its job
number and the sweep folder its :class:`~foxdqn.population.jobs.Member` carries); the members of one
population run at once, so, as jobs running side by side, they do not count for each other.
"""
from __future__ import annotations

import json
import logging
import math
import warnings
from pathlib import Path

from foxdqn.io_atomic import write_json_atomic

log = logging.getLogger(__name__)

#: the sub-folder of a sweep folder with one file per job: {"state", "intermediate": {env_steps: value}}
PRUNING_FOLDER = ".pruning"


def excluded(cfg, selection: dict, stop_reason: str) -> str | None:
    """Why the run's value must not count in a search, or None.

    Args:
        cfg: the run's :class:`~foxdqn.config.schema.TrainConfig`.
        selection: ``summary["selection"]`` (its ``trades``: trades of the kept weights on val).
        stop_reason: ``summary["stop"]["reason"]``.
    """
    if stop_reason == "pruned":
        return "pruned"
    if cfg.search.exclude_no_trades and cfg.env.name == "trading" and selection.get("trades") == 0:
        return "never trades on val"
    return None


class MedianTrialPruner:
    """Optuna's median pruning across the jobs of one sweep folder (see the module docstring).

    Args:
        folder: the sweep folder (``hydra.sweep.dir``).
        job: this job's number (``hydra.job.num``).
        search: :class:`~foxdqn.config.schema.SearchConfig` (``n_startup_trials``, ``n_warmup_steps``).
        lower_is_better: the validation metric is lower-is-better (``max_drawdown``).
        member: the job is a member of a population (foxdqn.population.train): its pruning line
            names it (``job N: pruned at ...``) and goes to its own log file only (``foxdqn_job``).

    Raises:
        ImportError: optuna is not installed.
    """

    def __init__(self, folder: Path, job: int, search, lower_is_better: bool = False, member: bool = False) -> None:
        import optuna

        self.folder = Path(folder) / PRUNING_FOLDER
        self.path = self.folder / f"{int(job)}.json"
        self.name, self.extra = (f"job {int(job)}: ", {"foxdqn_job": int(job)}) if member else ("", None)
        self.direction = "minimize" if lower_is_better else "maximize"
        self.pruner = optuna.pruners.MedianPruner(n_startup_trials=search.n_startup_trials,
                                                  n_warmup_steps=search.n_warmup_steps)
        self.intermediate: dict[int, float] = {}
        self._write("running")

    def _write(self, state: str) -> None:
        write_json_atomic(self.path, {"state": state, "direction": self.direction,
                                      "intermediate": {str(k): v for k, v in self.intermediate.items()}})

    def _finished(self) -> list[dict[int, float]]:
        """The intermediate values of the sweep's other jobs that completed (pruned, failed and
        running jobs do not count, as in Optuna)."""
        out = []
        for path in sorted(self.folder.glob("*.json")):
            if path == self.path:
                continue
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):  # a file being replaced or torn: that job does not count now
                continue
            if record.get("state") == "complete" and record.get("intermediate"):
                out.append({int(k): float(v) for k, v in record["intermediate"].items()})
        return out

    def report(self, env_steps: int, value: float) -> bool:
        """Record the validation ``value`` at ``env_steps``; True when the job should stop (pruned)."""
        import optuna
        from optuna.trial import TrialState, create_trial

        if not math.isfinite(value):
            return False
        self.intermediate[int(env_steps)] = float(value)
        self._write("running")
        with warnings.catch_warnings():  # create_trial / add_trial are "experimental" in Optuna 2
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study = optuna.create_study(direction=self.direction)
            for values in self._finished():
                study.add_trial(create_trial(state=TrialState.COMPLETE, value=values[max(values)],
                                             intermediate_values=values))
            prune = self.pruner.prune(study, create_trial(state=TrialState.RUNNING,
                                                          intermediate_values=dict(self.intermediate)))
        if prune:
            log.warning("%spruned at %d env steps: validation %.4g is below the median of %d finished jobs "
                        "(search.pruner=median)", self.name, env_steps, value, len(study.trials), extra=self.extra)
        return bool(prune)

    def finish(self, pruned: bool) -> None:
        """Mark this job ``complete`` (its values now count for the other jobs) or ``pruned``."""
        self._write("pruned" if pruned else "complete")


def sweep_folder(hc) -> Path:
    """The sweep folder of the running multirun job whose Hydra config is ``hc``, absolute: a
    relative ``hydra.sweep.dir`` is relative to the folder the multirun started in
    (``hydra.runtime.cwd``), also when the job runs in its own folder (``hydra.job.chdir=true``)."""
    return Path(str(hc.runtime.cwd)) / str(hc.sweep.dir)


def sweep_pruner(cfg, folder: Path, job: int, member: bool = False) -> MedianTrialPruner:
    """Job ``job``'s :class:`MedianTrialPruner` in the sweep folder ``folder``, on the validation
    metric of ``cfg`` (``early_stop.metric``, resolved for the env); ``member``: a population
    member's (:func:`member_pruner`)."""
    from foxdqn.analysis.metrics import LOWER_IS_BETTER
    from foxdqn.run.early_stop import resolve_metric

    metric = resolve_metric(cfg.early_stop.metric, cfg.env.name)
    return MedianTrialPruner(folder, job, cfg.search, metric in LOWER_IS_BETTER, member=member)


def member_pruner(member) -> MedianTrialPruner | None:
    """The :class:`MedianTrialPruner` of a population's member (:class:`foxdqn.population.jobs.Member`:
    its job number and sweep folder) with ``search.pruner=median``; else None (a warning where the
    setting cannot act: no validation during training, or a member that names no sweep folder:
    not a job of a ``--multirun``)."""
    cfg, job = member.tc, member.job_num
    if cfg.search.pruner != "median":
        return None
    if member.sweep_dir is None:
        log.warning("job %d: search.pruner=median acts on the jobs of a --multirun only: this member is not pruned",
                    job, extra={"foxdqn_job": job})
        return None
    if not cfg.eval.interval_env_steps:
        log.warning("job %d: search.pruner=median needs validation during training (eval.interval_env_steps): not "
                    "pruned", job, extra={"foxdqn_job": job})
        return None
    return sweep_pruner(cfg, Path(member.sweep_dir), member.job_num, member=True)
