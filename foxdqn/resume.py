"""Continuing a run: ``resume=auto`` (the run of ``hydra.run.dir``) or ``resume=PATH``.

:func:`resolve_resume` finds the checkpoint and the run folder, refuses what cannot be continued
(no checkpoint, a foreign one, a finished run, changed settings) and returns the payload that
:func:`foxdqn.loop.train` restores (foxdqn.checkpoint). :func:`read_checkpoint` loads a file once
per process: the precheck (before Hydra makes a folder) and the run share the load.
"""
from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from pathlib import Path

from foxdqn.checkpoint import load_checkpoint
from foxdqn.compose import from_plain
from foxdqn.config import TrainConfig, to_plain
from foxdqn.errors import ConfigError
from foxdqn.run_folder import MARKER, only_hydra_files

log = logging.getLogger(__name__)
_LOADED: dict = {}


def read_checkpoint(path: Path) -> dict:
    """:func:`foxdqn.checkpoint.load_checkpoint` of ``path``, kept for the next call with the same file
    (same path, size and modification time). Raises ConfigError like it, and for a population
    member's checkpoint (weights only: :func:`foxdqn.population.train.member_checkpoint`)."""
    path = Path(path)
    stat = path.stat() if path.is_file() else None
    key = (str(path.resolve()), stat and (stat.st_size, stat.st_mtime_ns))
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = load_checkpoint(path)
    if "population" in _LOADED[key]:
        raise ConfigError(f"resume: checkpoint {path} is a population member's (weights only, no optimizer or "
                          "replay); a population run cannot be resumed: evaluate it with python -m foxdqn.evaluate "
                          "checkpoint=PATH, or train again")
    return _LOADED[key]


#: Keys a resumed run may change (how it runs, not what it trains).
RESUME_MAY_CHANGE = ("resume", "device", "graph", "cpu_threads", "log", "logger", "checkpoint")


def resolve_resume(tc: TrainConfig, hydra_dir: Path, given: Iterable[str] = ()) -> tuple[TrainConfig, Path, dict | None]:
    """``resume=auto`` (the newest checkpoint of ``hydra.run.dir``) or ``resume=PATH``: the run to
    continue, its config, its folder and its checkpoint. The run keeps its own settings, read from
    the checkpoint (so ``resume=auto hydra.run.dir=RUN`` alone continues a run started with any
    overrides); of this call's config only :data:`RESUME_MAY_CHANGE` is taken. A key ``given`` on
    this command line (dotted key or group, e.g. ``optim.lr`` or ``head``) that is not among them
    must agree with the checkpoint. A Hydra folder made for this call that holds only ``.hydra/``
    and Hydra's log is removed when the run continues elsewhere. ``resume=auto`` of a run that was
    stopped before its first checkpoint (``INCOMPLETE``, no ``checkpoints/last.pt``) starts it over
    in its folder with this call's config: the payload is then None and the killed run's partial
    metrics.csv and tb/ are removed.

    Raises:
        ConfigError: no checkpoint, an unreadable or foreign one, a finished run, or a given key
            that differs from the checkpoint's.
    """
    if tc.resume == "auto":
        path = hydra_dir / "checkpoints" / "last.pt"
        if not path.is_file() and (hydra_dir / MARKER).is_file():
            log.warning("resume=auto: %s was stopped before its first checkpoint; starting it over", hydra_dir)
            (hydra_dir / "metrics.csv").unlink(missing_ok=True)
            (hydra_dir / "mlflow_run_id").unlink(missing_ok=True)  # the restarted run gets a new MLflow run
            shutil.rmtree(hydra_dir / "tb", ignore_errors=True)
            return tc, hydra_dir, None
        if not path.is_file():
            raise ConfigError(f"resume=auto: no checkpoint in {hydra_dir / 'checkpoints'}; set hydra.run.dir to the "
                              "folder of the run to continue, or resume=PATH to its checkpoint")
    else:
        path = resume_path(tc.resume)
    run_dir = path.resolve().parent.parent
    payload = read_checkpoint(path)
    _LOADED.clear()  # the run holds it from here: no second copy of a saved replay in memory
    if (run_dir / "eval" / "summary.json").is_file() and not (run_dir / MARKER).exists():
        raise ConfigError(f"resume: the run in {run_dir} has finished (eval/summary.json); nothing to continue")
    theirs = from_plain(payload["config"])  # keys added since the checkpoint: their defaults
    mine_plain, theirs_plain = to_plain(tc), to_plain(theirs)
    for key in sorted(set(given)):
        if key.split(".")[0] in RESUME_MAY_CHANGE:
            continue
        diff = _first_difference(_subtree(mine_plain, key), _subtree(theirs_plain, key), key)
        if diff is not None:
            raise ConfigError(f"resume: {diff} differs from the checkpoint's config ({path}); a resumed run keeps "
                              f"its settings (only {', '.join(RESUME_MAY_CHANGE)} may change)")
    for key in RESUME_MAY_CHANGE:
        setattr(theirs, key, getattr(tc, key))
    if hydra_dir.resolve() != run_dir and only_hydra_files(hydra_dir):
        shutil.rmtree(hydra_dir, ignore_errors=True)  # only Hydra's config copy and its log of this call
    return theirs, run_dir, payload


def given_keys(overrides: Iterable[str]) -> list[str]:
    """The config keys or groups a command line's overrides set (``+optim.lr=1`` → ``optim.lr``;
    ``head=c51`` → ``head``; ``hydra.*`` and ``hydra/*`` left out)."""
    keys = []
    for item in overrides:
        key = str(item).lstrip("+~").split("=", 1)[0].split("@", 1)[0].replace("/", ".")
        if key and not key.startswith("hydra"):
            keys.append(key)
    return keys


def _subtree(values: dict, dotted: str):
    node = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def resume_path(value: str) -> Path:
    """The checkpoint file of ``resume=PATH`` (a run folder means its ``checkpoints/last.pt``).

    Raises:
        ConfigError: neither a file nor a run folder with a checkpoint.
    """
    path = Path(value).expanduser()
    if path.is_dir():
        if (path / "checkpoints" / "last.pt").is_file():
            return path / "checkpoints" / "last.pt"
        raise ConfigError(f"resume={value}: a folder without checkpoints/last.pt; give a checkpoint file or a run folder")
    return path


def _first_difference(a, b, key: str) -> str | None:
    """The first dotted key (under ``key``) where ``a`` and ``b`` (plain values or nested dicts)
    differ, as ``"key (a here, b there)"``. None when they agree."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        same = a == b or (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and list(a) == list(b))
        return None if same else f"{key} ({a!r} here, {b!r} there)"
    for k in sorted(set(a) | set(b)):
        found = _first_difference(a.get(k), b.get(k), f"{key}.{k}")
        if found:
            return found
    return None
