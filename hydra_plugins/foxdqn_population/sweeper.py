"""Hydra's basic sweeper with its check of each batch done once per structure: what
``hydra/sweeper=basic`` (Hydra's default) runs under ``python -m foxdqn.train`` (:func:`register`),
and ``hydra/sweeper=foxdqn`` anywhere.

Hydra's :class:`~hydra._internal.core_plugins.basic_sweeper.BasicSweeper` composes every job of a
batch through Hydra before launching it (``validate_batch_is_legal``): about 0.4 s a job on a
2-core CPU, most of a 64-seed sweep's host time there. Here a job whose overrides differ from an
already composed job's only in values of plain leaves (:meth:`foxdqn.config.compose.JobComposer.value_changes`:
``seed=3``, ``optim.lr=1e-3``; not a group, ``+key``, ``~key`` or ``hydra.*``) is not composed
again: such a job composes exactly when its base does, up to the value's type, and foxdqn checks
every job's values before the sweep (:class:`foxdqn.cli.callbacks.CheckJobs`: one line and
exit 2 for a value the schema does not take). Everything else is the basic sweeper's: the same
batches, job numbers, ``multirun.yaml`` and sweep folder.
"""

import sys
from dataclasses import dataclass
from typing import List, Optional, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeperConf
from hydra.core.config_store import ConfigStore


@dataclass
class FoxdqnSweeperConf(BasicSweeperConf):
    """``hydra/sweeper=foxdqn``: :class:`~hydra._internal.core_plugins.basic_sweeper.BasicSweeperConf`'s
    keys (``max_batch_size``, ``params``)."""

    _target_: str = "hydra_plugins.foxdqn_population.sweeper.FoxdqnBasicSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="foxdqn", node=FoxdqnSweeperConf, provider="foxdqn")

_CLASSES: dict = {}
#: the batch's jobs composed by the sweeper's check: overrides → (the master config, its sweep config),
#: handed once to the launcher (:func:`take_composed`), which would compose the same job again
_COMPOSED: dict = {}


def take_composed(master_config, overrides: Sequence[str]):
    """The sweep config that this process's sweeper composed for the job ``overrides`` of the
    multirun of ``master_config`` (the same object), removed from the hand-over; None when it did
    not (another sweeper, another multirun, or taken already). Hydra's ``load_sweep_config`` of the
    same master config and overrides gives the same config, so the launcher takes this one instead
    of composing the job a second time (about 0.4 s a structure on a 2-core CPU)."""
    found = _COMPOSED.get(tuple(overrides))
    if found is None or found[0] is not master_config:
        return None
    del _COMPOSED[tuple(overrides)]
    return found[1]


def sweeper_class() -> type:
    """``FoxdqnBasicSweeper``: a subclass of Hydra's ``BasicSweeper`` as the module is now (Hydra's
    plugin scan executes its plugin modules again, which makes a new ``BasicSweeper`` class; a
    subclass of an earlier one fails in ``BasicSweeper.__init__``), made once per such class. Its
    name ends with ``BasicSweeper``: foxdqn's checks treat it as the basic sweeper it is."""
    base = sys.modules["hydra._internal.core_plugins.basic_sweeper"].BasicSweeper
    if base not in _CLASSES:
        class FoxdqnBasicSweeper(base):
            """Hydra's basic sweeper composing one job per structure of each batch before launching
            it (module docstring). ``composed``: jobs of the last batch composed through Hydra."""

            def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
                from foxdqn.config.compose import JobComposer

                loader = self.hydra_context.config_loader
                bases: List[tuple] = []
                self.composed = 0
                _COMPOSED.clear()
                for overrides in batch:
                    job = list(overrides)
                    if any(JobComposer.value_changes(job, first, cfg) is not None for first, cfg in bases):
                        continue
                    bases.append((job, loader.load_sweep_config(master_config=self.config, sweep_overrides=job)))
                    _COMPOSED[tuple(job)] = (self.config, bases[-1][1])
                    self.composed += 1

        FoxdqnBasicSweeper.__module__, FoxdqnBasicSweeper.__qualname__ = __name__, "FoxdqnBasicSweeper"
        _CLASSES[base] = FoxdqnBasicSweeper
    globals()["FoxdqnBasicSweeper"] = _CLASSES[base]  # where Hydra's instantiate locates the _target_
    return _CLASSES[base]


def register() -> None:
    """Make :func:`sweeper_class` what ``hydra/sweeper=basic`` and ``hydra/sweeper=foxdqn``
    instantiate (``python -m foxdqn.train`` calls this before Hydra starts; see
    :func:`hydra_plugins.foxdqn_population.population_launcher.register`). Hydra's plugin scan runs
    once per process, when ``Plugins.instance()`` is first called: it is called here first, so that
    the scan's store of Hydra's own ``basic`` entry comes before this one and the class is made from
    the scan's ``BasicSweeper``. A sweeper chosen by another name (``optuna``, a search file's) is
    untouched."""
    from hydra.core.plugins import Plugins

    plugins = Plugins.instance()  # the scan (once per process) stores Hydra's "basic" now, before ours
    ConfigStore.instance().store(group="hydra/sweeper", name="basic", node=FoxdqnSweeperConf, provider="foxdqn")
    plugins.register(sweeper_class())
