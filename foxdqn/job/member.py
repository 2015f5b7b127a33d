"""One job as a population member (:func:`job_member`): what :func:`foxdqn.job.run.run_job` hands
the population trainer to train a single run as a population of one."""
from __future__ import annotations

from pathlib import Path

from foxdqn.config.schema import TrainConfig
from foxdqn.population.jobs import Member


def job_member(tc: TrainConfig, market, run_dir: Path, payload: dict | None = None,
               run_id: str | None = None) -> Member:
    """The :class:`~foxdqn.population.jobs.Member` of the running job: its validated config, market
    data, run folder and what it resumes (``payload``, ``run_id``: foxdqn.run.resume), with Hydra's
    job number, task overrides and, in a ``--multirun``, its sweep folder (where the median pruner
    finds the sweep's jobs); outside Hydra (a test calling run_job) job 0, no overrides, no sweep."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return Member(tc, market, Path(run_dir), 0, [], payload, run_id)
    from foxdqn.run.search import sweep_folder

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN  # (a single run has no hydra.job.num)
    return Member(tc, market, Path(run_dir), int(hc.job.num) if multirun else 0, [str(o) for o in hc.overrides.task],
                  payload, run_id, sweep_dir=sweep_folder(hc) if multirun else None)
