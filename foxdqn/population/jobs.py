"""A multirun job as the population launcher collects it (:class:`Member`), what its training came
to (:class:`Outcome`), and the process-wide :data:`COLLECTOR` through which ``foxdqn.train``'s
task function hands a checked job to the launcher instead of training it.

The launcher (``hydra_plugins.foxdqn_population.population_launcher``) runs every job's task
function with :data:`COLLECTOR` active: the job's config is validated and preflighted as in any
run, Hydra writes the job's ``.hydra/`` files, and the task function records a :class:`Member` and
returns without training. The launcher then trains the members in groups
(:func:`foxdqn.population.grouping.plan`). docs/usage.md#a-sweep-in-one-process-hydralauncherpopulation.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:  # for the annotation only: foxdqn.train imports this module at start-up
    from foxdqn.config.schema import TrainConfig

#: Outcome.exit_code values: the run finished (its summary holds the selection), bad input (one
#: line, foxdqn.errors.FoxdqnError), halted by an on-device guard (foxdqn.errors.HaltError).
FINISHED, BAD_INPUT, HALTED = 0, 2, 3
EXIT_CODES = (FINISHED, BAD_INPUT, HALTED)


@dataclass
class Member:
    """One job of a multirun, checked and ready to train.

    Attributes:
        tc: the job's validated config (:func:`foxdqn.config.schema.finalize`, debug caps applied).
        market: the job's market data (:func:`foxdqn.job.check.preflight`; None for envs other than
            trading), shared between jobs of one data setting.
        run_dir: the folder the run writes its outputs into: Hydra's job output folder
            (``hydra.runtime.output_dir``; for ``resume=...`` the resumed run's folder).
        job_num: Hydra's ``hydra.job.num`` (the job's index in the multirun).
        overrides: the job's task overrides as given (``hydra.overrides.task``, e.g. ``"seed=1"``).
        payload: the checkpoint a ``resume=...`` job continues from (foxdqn.run.resume); None otherwise.
            Such a job never joins a population (grouping.batch_refusal).
        run_id: the id of the run a ``resume=...`` job continues (its start record); None otherwise.
        sweep_dir: the multirun's sweep folder (``hydra.sweep.dir``, absolute), shared by its jobs:
            where a member's median pruner (``search.pruner=median``, foxdqn.run.search) finds the
            sweep's finished jobs; None: a member outside a multirun, never pruned.
    """

    tc: "TrainConfig"
    market: Any
    run_dir: Path
    job_num: int
    overrides: list[str]
    payload: dict | None = None
    run_id: str | None = None
    sweep_dir: Path | None = None


@dataclass
class Outcome:
    """What one member's training came to.

    Attributes:
        summary: the run's ``eval/summary.json`` dict (with ``selection``) when ``exit_code`` is
            :data:`FINISHED`, else None.
        exit_code: :data:`FINISHED` (0), :data:`BAD_INPUT` (2) or :data:`HALTED` (3).
        message: for a failed member, the one line the job reports (``foxdqn: error: job N:
            <message>``), e.g. ``"training halted: <reason>"``; "" when finished.

    Raises:
        ValueError: an exit code other than 0, 2, 3, or a finished outcome without a summary
            that holds ``selection``.
    """

    summary: dict | None
    exit_code: int
    message: str = ""

    def __post_init__(self) -> None:
        if self.exit_code not in EXIT_CODES:
            raise ValueError(f"Outcome.exit_code={self.exit_code!r}: must be one of {EXIT_CODES}")
        if self.exit_code == FINISHED and not (isinstance(self.summary, dict) and "selection" in self.summary):
            raise ValueError("a finished Outcome needs its summary dict with a 'selection' entry "
                             "(foxdqn.job.run.objective reads it)")


@dataclass
class Collector:
    """Jobs handed over by ``foxdqn.train``'s task function while :attr:`active`.

    Attributes:
        active: True while a population launcher collects; the task function then records the
            job (:meth:`add`) and returns None instead of training.
        members: the jobs recorded, in the order their task functions ran.
    """

    active: bool = False
    members: list[Member] = field(default_factory=list)

    def add(self, member: Member) -> None:
        """Record ``member``. Raises RuntimeError when not :attr:`active` (a job would be lost)."""
        if not self.active:
            raise RuntimeError("COLLECTOR.add outside a collection: the job would never train")
        self.members.append(member)

    @contextmanager
    def collecting(self) -> Iterator["Collector"]:
        """Active, with no member, for the ``with`` block; inactive again after it, whatever
        happens (the members stay readable)."""
        if self.active:
            raise RuntimeError("a population collection is already running in this process")
        self.members = []
        self.active = True
        try:
            yield self
        finally:
            self.active = False


#: The process's collector (one multirun at a time per process).
COLLECTOR = Collector()
