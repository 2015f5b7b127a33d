"""Continuing a run: ``resume=auto`` (the run of ``hydra.run.dir``) or ``resume=PATH``.

:func:`resolve_resume` finds the checkpoint and the run folder, refuses what cannot be continued
(no checkpoint, a foreign one, a finished run, changed settings) and returns the payload that
:func:`foxdqn.loop.train` restores (foxdqn.checkpoint). :func:`read_checkpoint` loads a file once
per process: the precheck (before Hydra makes a folder) and the run share the load.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

from foxdqn.checkpoint import load_checkpoint
from foxdqn.compose import from_plain
from foxdqn.config import TrainConfig, to_plain
from foxdqn.errors import ConfigError
from foxdqn.run_folder import MARKER

log = logging.getLogger(__name__)
_LOADED: dict = {}


def read_checkpoint(path: Path) -> dict:
    """:func:`foxdqn.checkpoint.load_checkpoint` of ``path``, kept for the next call with the same file
    (same path, size and modification time). Raises ConfigError like it."""
    path = Path(path)
    stat = path.stat() if path.is_file() else None
    key = (str(path.resolve()), stat and (stat.st_size, stat.st_mtime_ns))
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = load_checkpoint(path)
    return _LOADED[key]


#: Keys a resumed run may change (how it runs, not what it trains).
RESUME_MAY_CHANGE = ("resume", "device", "graph", "cpu_threads", "log", "logger", "checkpoint")


def resolve_resume(tc: TrainConfig, hydra_dir: Path) -> tuple[TrainConfig, Path, dict | None]:
    """``resume=auto`` (the newest checkpoint of ``hydra.run.dir``) or ``resume=PATH``: the run to
    continue, its folder and its checkpoint. The config must be the checkpoint's, but for
    :data:`RESUME_MAY_CHANGE`. A Hydra folder made for this call that holds only ``.hydra/`` and
    Hydra's log is removed when the run continues elsewhere. ``resume=auto`` of a run that was
    stopped before its first checkpoint (``INCOMPLETE``, no ``checkpoints/last.pt``) starts it over in its folder: the
    payload is then None and the killed run's partial metrics.csv and tb/ are removed.

    Raises:
        ConfigError: no checkpoint, an unreadable or foreign one, a finished run, or another config.
    """
    if tc.resume == "auto":
        path = hydra_dir / "checkpoints" / "last.pt"
        if not path.is_file() and (hydra_dir / MARKER).is_file():
            log.warning("resume=auto: %s was stopped before its first checkpoint; starting it "
                                                "over", hydra_dir)
            (hydra_dir / "metrics.csv").unlink(missing_ok=True)
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
    mine, theirs = to_plain(tc), to_plain(from_plain(payload["config"]))  # keys added since: their defaults
    diff = _first_difference(mine, theirs, RESUME_MAY_CHANGE)
    if diff is not None:
        raise ConfigError(f"resume: {diff} differs from the checkpoint's config ({path}); a resumed run keeps "
                          f"its settings (only {', '.join(RESUME_MAY_CHANGE)} may change)")
    if hydra_dir.resolve() != run_dir and all(p.name == ".hydra" or p.suffix == ".log" for p in hydra_dir.iterdir()):
        shutil.rmtree(hydra_dir, ignore_errors=True)  # only Hydra's config copy and its log of this call
    return tc, run_dir, payload


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


def _first_difference(a: dict, b: dict, allowed: tuple[str, ...], prefix: str = "") -> str | None:
    for key in sorted(set(a) | set(b)):
        name = f"{prefix}{key}"
        if name in allowed:
            continue
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            found = _first_difference(x, y, allowed, f"{name}.")
            if found:
                return found
        elif x != y and not (isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)) and list(x) == list(y)):
            return f"{name} ({x!r} here, {y!r} there)"
    return None
