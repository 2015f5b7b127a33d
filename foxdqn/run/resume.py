"""Continuing a run: ``resume=auto`` (the run of ``hydra.run.dir``) or ``resume=PATH``.

:func:`resolve_resume` finds the run folder, its start record (``config.yaml``, written before
anything else of the run: :mod:`foxdqn.run.folder`) and its checkpoint, refuses what cannot be
continued (a finished run, a checkpoint outside a run folder or of another run, a setting given
again that differs, a checkpoint of the single-run loop an older foxdqn had) and returns what
:func:`foxdqn.job.run.run_job` continues from (:class:`Continuation`). The start record is the truth: a resume keeps the config the run started
with, whatever this call composed; only the keys of :data:`RESUME_MAY_CHANGE` that this call names
are taken from it. A run killed before its first checkpoint starts over, in its folder, with that
same config (:func:`start_over`, once the run holds the folder's lock).
:func:`read_checkpoint` loads a file once per process.
"""
from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from foxdqn.run.checkpoint import load_checkpoint
from foxdqn.config.compose import from_plain
from foxdqn.config.schema import TrainConfig, finalize, to_plain, upgrade
from foxdqn.errors import ConfigError
from foxdqn.run.folder import MARKER, RECORD, only_hydra_files, read_record

log = logging.getLogger(__name__)
_LOADED: dict = {}


def read_checkpoint(path: Path) -> dict:
    """:func:`foxdqn.run.checkpoint.load_checkpoint` of ``path``, kept for the next call with the same file
    (same path, size and modification time). Raises ConfigError like it, and for a checkpoint
    that cannot be continued: a population member's that holds weights only (``population``
    without ``member_state``: a ``best.pt``, or one an older foxdqn wrote;
    :func:`foxdqn.population.checkpoint.member_checkpoint`), or one of the single-run loop an older
    foxdqn had (neither key; its weights still evaluate: ``python -m foxdqn.evaluate``)."""
    path = Path(path)
    stat = path.stat() if path.is_file() else None
    key = (str(path.resolve()), stat and (stat.st_size, stat.st_mtime_ns))
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = load_checkpoint(path)
    if "population" in _LOADED[key] and "member_state" not in _LOADED[key]:
        raise ConfigError(f"resume: checkpoint {path} is a population member's weights only (no optimizer or "
                          "replay), so it cannot be resumed: resume from the run's checkpoints/last.pt, evaluate it "
                          "with python -m foxdqn.evaluate checkpoint=PATH, or train again")
    if "member_state" not in _LOADED[key]:
        _LOADED.clear()
        raise ConfigError(f"resume: checkpoint {path} was written by the single-run training loop of an older foxdqn "
                          "(no member_state), which this foxdqn cannot continue: start a new run (without resume=), "
                          f"or evaluate its weights with python -m foxdqn.evaluate checkpoint={path}")
    return _LOADED[key]


#: Keys a resumed run may change (how it runs, not what it trains).
RESUME_MAY_CHANGE = ("resume", "device", "graph", "cpu_threads", "log", "logger", "checkpoint")


class Continuation(NamedTuple):
    """What a resume continues: ``tc`` the run's config (its record's, with the keys of
    :data:`RESUME_MAY_CHANGE` this call names), ``run_dir`` its folder, ``payload`` the checkpoint
    to restore (None: the run starts over from its first step), ``run_id`` the record's id (None: a
    new run)."""

    tc: TrainConfig
    run_dir: Path
    payload: dict | None
    run_id: str | None


def resolve_resume(tc: TrainConfig, hydra_dir: Path, given: Iterable[str] = (), existed: bool = True) -> Continuation:
    """``resume=auto`` (the folder ``hydra.run.dir``) or ``resume=PATH`` (a checkpoint inside a run
    folder, or the run folder): the run to continue.

    * The config is the folder's start record, ``config.yaml`` (:func:`foxdqn.run.folder.read_record`);
      a folder killed before its record was written has Hydra's copy of the starting call,
      ``.hydra/config.yaml``; a folder with neither (nothing of a run was written) starts this
      call's config. A key ``given`` on this command line (dotted key or group, ``optim.lr``,
      ``head``) that is not in :data:`RESUME_MAY_CHANGE` must agree with it.
    * The checkpoint (``checkpoints/last.pt`` for ``auto``) must carry the record's run id and its
      config; a checkpoint with a run id in a folder without a record is another folder's. Without
      a checkpoint the run starts over in its folder (the caller removes its partial outputs with
      :func:`start_over` once it holds the folder's lock).
    * Of :data:`RESUME_MAY_CHANGE`, only the keys this call names (``given``) are taken from
      ``tc``: ``resume=auto hydra.run.dir=RUN`` alone keeps the run's own ``log``, ``checkpoint``,
      ``device`` and logger settings.
    * A Hydra folder made for this call that holds only ``.hydra/`` and Hydra's log is removed when
      the run continues elsewhere. ``existed``: ``hydra_dir`` existed before this call (else its
      ``.hydra/`` is this call's, not a start's).

    Raises:
        ConfigError: a finished run, a checkpoint outside a run folder, of another run or
            unreadable (foxdqn.run.checkpoint), a record that was edited or does not match its
            checkpoint, or a given key that differs from the run's config.
    """
    given = list(given)
    if tc.resume == "auto":
        run_dir = hydra_dir.resolve()
        path = run_dir / "checkpoints" / "last.pt"
        path = path if path.is_file() else None
    else:
        path = resume_path(tc.resume)
        run_dir = path.resolve().parent.parent
        if path.resolve().parent.name != "checkpoints" or not (run_dir / RECORD).is_file():
            raise ConfigError(f"resume={tc.resume}: {path} is not a checkpoint inside a run folder "
                              f"(RUN/checkpoints/*.pt with RUN/{RECORD} beside checkpoints/); a resume continues "
                              "a run in its own folder: copy the whole run folder, not the checkpoint alone")
    if (run_dir / "eval" / "summary.json").is_file() and not (run_dir / MARKER).exists():
        raise ConfigError(f"resume: the run in {run_dir} has finished (eval/summary.json); nothing to continue")
    record = read_record(run_dir)
    payload = read_checkpoint(path) if path is not None else None
    _LOADED.clear()  # the run holds it from here: no second copy of a saved replay in memory
    if record is not None:
        run_id, values = record
        truth = from_plain(upgrade(values))
        if payload is not None:
            _check_same_run(payload, path, run_id, truth, run_dir)
    elif payload is not None:
        if payload.get("run_id") is not None:
            raise ConfigError(f"resume: checkpoint {path} belongs to a run (id {payload['run_id']}) that {run_dir} holds no "
                              f"record of (no {RECORD}); a run is continued only in its own folder")
        truth, run_id = from_plain(payload["config"]), None  # upgraded from a foxdqn before start records
    else:
        truth, run_id = _started_config(run_dir, tc, given, existed), None
    _check_given(to_plain(tc), to_plain(truth), given, run_dir)
    truth.resume = tc.resume
    for key in given:  # only what this call names; the rest of the run's settings stay
        if key.split(".")[0] in RESUME_MAY_CHANGE:
            _copy_key(tc, truth, key)
    if hydra_dir.resolve() != run_dir and only_hydra_files(hydra_dir):
        shutil.rmtree(hydra_dir, ignore_errors=True)  # only Hydra's config copy and its log of this call
    return Continuation(truth, run_dir, payload, run_id)


def _check_same_run(payload: dict, path: Path, run_id: str | None, truth: TrainConfig, run_dir: Path) -> None:
    """Raise ConfigError unless checkpoint ``payload`` (from ``path``) is of the run recorded in ``run_dir``."""
    theirs = payload.get("run_id")
    if theirs != run_id:
        raise ConfigError(f"resume: checkpoint {path} belongs to another run (id {theirs or 'none'}) than the one "
                          f"recorded in {run_dir / RECORD} (id {run_id or 'none'}); a run is continued only from its "
                          "own checkpoints")
    mine = {k: v for k, v in to_plain(truth).items() if k not in RESUME_MAY_CHANGE}
    ckpt = {k: v for k, v in to_plain(from_plain(payload["config"])).items() if k not in RESUME_MAY_CHANGE}
    diff = _first_difference(ckpt, mine, "")
    if diff is not None:
        raise ConfigError(f"resume: checkpoint {path} and {run_dir / RECORD} disagree on {diff.lstrip('.')}; "
                          f"the record was changed after the run started")


def _started_config(run_dir: Path, tc: TrainConfig, given: Iterable[str], existed: bool) -> TrainConfig:
    """The config of a run killed before its start record: Hydra's copy of the call that made the
    folder (``.hydra/config.yaml`` of a folder that ``existed`` before this call, whole when
    ``.hydra/overrides.yaml``, written after it, is), else this call's ``tc`` when the call names
    the run's settings (a retry loop's whole command line: nothing of a run was written).

    Raises:
        ConfigError: nothing was recorded and the call gives no setting but ``resume`` and Hydra's.
    """
    from omegaconf import OmegaConf

    hydra = run_dir / ".hydra"
    if existed and (hydra / "config.yaml").is_file() and (hydra / "overrides.yaml").is_file():
        try:
            started = finalize(OmegaConf.load(hydra / "config.yaml"))
        except Exception as exc:  # noqa: BLE001 - a copy that no longer composes: said, then this call's config
            log.warning("resume=auto: %s holds a start that cannot be read again (%s); starting this call's config",
                        run_dir, str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__)
        else:
            log.warning("resume=auto: %s was stopped before its config was recorded; starting it over with the "
                        "config of the call that started it (.hydra/)", run_dir)
            return started
    if not [k for k in given if k.split(".")[0] not in RESUME_MAY_CHANGE]:
        raise ConfigError(f"resume=auto: no run in {run_dir} (no config.yaml or .hydra/ record"
                          f"{'' if existed else ', the folder does not exist'}); check hydra.run.dir, or give the "
                          "run's settings (e.g. +experiment=...) to start it there")
    log.info("resume=auto: no record of a run's config in %s; starting this call's config there", run_dir)
    return tc


def _check_given(mine: dict, theirs: dict, given: Iterable[str], run_dir: Path) -> None:
    """Raise ConfigError at the first key ``given`` on the command line (not in
    :data:`RESUME_MAY_CHANGE`) whose value differs between this call (``mine``) and the run."""
    for key in sorted(set(given)):
        if key.split(".")[0] in RESUME_MAY_CHANGE:
            continue
        diff = _first_difference(_subtree(mine, key), _subtree(theirs, key), key)
        if diff is not None:
            raise ConfigError(f"resume: {diff} differs from the config of the run in {run_dir}; a resumed run keeps "
                              f"its settings (only {', '.join(RESUME_MAY_CHANGE)} may change)")


def _copy_key(src, dst, dotted: str) -> None:
    """Set ``dotted`` (a key or group of the config, ``log.progress``, ``logger``) of ``dst`` to its
    value in ``src``; a key the schema does not have is left alone."""
    *parents, leaf = dotted.split(".")
    for part in parents:
        src, dst = getattr(src, part, None), getattr(dst, part, None)
        if src is None or dst is None:
            return
    if hasattr(src, leaf) and hasattr(dst, leaf):
        setattr(dst, leaf, getattr(src, leaf))


def start_over(run_dir: Path) -> None:
    """Remove what a run killed before its first checkpoint wrote after its start record (its
    ``metrics.csv``, ``tb/`` and MLflow run id). Call it only while holding the folder's lock
    (:class:`foxdqn.run.folder.RunFolder`): another process may be that run, still training."""
    if (run_dir / MARKER).exists() or (run_dir / "metrics.csv").exists():
        log.warning("resume: %s was stopped before its first checkpoint; starting it over from its first step", run_dir)
    (run_dir / "metrics.csv").unlink(missing_ok=True)
    (run_dir / "mlflow_run_id").unlink(missing_ok=True)  # the restarted run gets a new MLflow run
    shutil.rmtree(run_dir / "tb", ignore_errors=True)


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


def resume_path(value: str, key: str = "resume") -> Path:
    """The checkpoint file of ``resume=PATH`` (a run folder means its ``checkpoints/last.pt``);
    ``key``: the argument's name in the messages (``checkpoint`` for python -m foxdqn.evaluate).

    Raises:
        ConfigError: neither a file nor a run folder with a checkpoint.
    """
    path = Path(value).expanduser()
    if path.is_dir():
        if (path / "checkpoints" / "last.pt").is_file():
            return path / "checkpoints" / "last.pt"
        raise ConfigError(f"{key}={value}: a folder without checkpoints/last.pt; give a checkpoint file or a run folder")
    if not path.is_file():
        raise ConfigError(f"{key}={value}: no such file or run folder")
    return path


def _shown(value) -> str:
    """A config value as the command line writes it: ``null``, ``true``/``false``, else its repr."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _first_difference(a, b, key: str) -> str | None:
    """The first dotted key (under ``key``, in ``a``'s order: the schema's) where ``a`` and ``b``
    (plain values or nested dicts) differ, as ``"key (a here, b there)"`` (values as the command
    line writes them: ``null``, ``true``). None when they agree."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        same = a == b or (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and list(a) == list(b))
        return None if same else f"{key} ({_shown(a)} here, {_shown(b)} there)"
    for k in [*a, *(k for k in b if k not in a)]:
        found = _first_difference(a.get(k), b.get(k), f"{key}.{k}")
        if found:
            return found
    return None
