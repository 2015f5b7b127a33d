"""Checkpoints: everything a run needs to continue, written atomically, loaded without running code.

A checkpoint file is a header and a body (format :data:`FORMAT`, docs/outputs.md#checkpoint-files):

* the line :data:`MAGIC`, then one line of JSON ``{"format": 5, "sha256": <hex>, "bytes": <n>}``;
* the body: ``n`` bytes of ``torch.save`` of a dict of tensors and plain data only (numbers,
  strings, booleans, None, lists, tuples, dicts), so that it loads with ``torch.load(...,
  weights_only=True)``, whose unpickler builds tensors and those types and nothing else. Since
  format 5 the payload's tensors are packed (:func:`pack`): the body is ``{"packed": payload with
  None where each tensor was, "tensors": [[keys, dtype, offset, shape], ...], "buffers": {dtype:
  one flat tensor}}``, so that ``torch.save`` pickles one tensor per dtype instead of one per state
  tensor (a population member's checkpoint holds about 90: 1.4 against 2.0 ms to encode on a 2-core
  CPU, docs/bench.md#population). :func:`decode` rebuilds the payload, each tensor its own copy. A
  format-4 body (the payload itself) still loads.

:func:`load_checkpoint` checks the header and the body's SHA-256 before it unpickles anything:
a foreign file, a flipped byte or a cut file is one :class:`~foxdqn.errors.ConfigError` naming
the path (exit 2). A file of an older foxdqn (a plain ``torch.save`` pickle, which can run code
when loaded) is refused with the command that converts it once, :func:`upgrade_file`
(``python -m foxdqn.run.checkpoint upgrade PATH``), which reads it with ``weights_only=True`` too,
allowing only the few classes an older foxdqn pickled into its loop state (:func:`_old_globals`):
a pickle that names anything else is refused, never run.

A body is written through :func:`write_payload` (:func:`foxdqn.io_atomic.write_bytes_atomic`, so
that a crash or a full disk never leaves a partial file or a ``.tmp`` behind). A training run's
checkpoints are its members' (:func:`foxdqn.population.checkpoint.member_checkpoint`: the weights
``online`` / ``target``, ``config``, ``env_steps``, ``updates``, ``run_id`` and, in a resumable
``last.pt``, ``member_state``). A checkpoint of the single-run loop an older foxdqn had (``online``,
``target``, ``optimizer``, ``tensors``, ``generators``, ``loop``, no ``member_state``) still loads
here: ``python -m foxdqn.evaluate`` reads its weights; a resume refuses it
(:func:`foxdqn.run.resume.read_checkpoint`).
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import sys
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterator

import torch

from foxdqn.config import schema as C
from foxdqn.config.schema import upgrade
from foxdqn.errors import ConfigError
from foxdqn.io_atomic import write_bytes_atomic
from foxdqn.run.early_stop import EarlyStopper

#: 5: the body's tensors packed, one flat buffer per dtype (:func:`pack`); 4: the header with the
#: body's SHA-256, plain data only (weights_only); 3: keys of the single-run loop's state parts
#: (nets., rollout., monitors., ...), parameters stored once, a pickled loop state.
FORMAT = 5
#: The first format whose body is packed (:func:`pack`).
PACKED = 5
#: The first line of every checkpoint file of format 4 and later.
MAGIC = b"FOXDQN-CHECKPOINT\n"
#: Types a checkpoint body may hold besides tensors (what ``torch.load(weights_only=True)`` rebuilds).
PLAIN = (str, int, float, bool, type(None), bytes)
_SKIP_TYPES = (str, bytes, int, float, bool, type(None), torch.device, torch.dtype)
_LEAVES = frozenset(PLAIN)


def _walk(obj: Any, path: str, seen: set[int]) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor reachable from ``obj`` (attributes, lists, tuples, dicts, modules), once each."""
    if isinstance(obj, torch.Tensor):
        if id(obj) not in seen:
            seen.add(id(obj))
            yield path, obj
        return
    if isinstance(obj, _SKIP_TYPES) or id(obj) in seen or callable(obj) and not hasattr(obj, "__dict__"):
        return
    if getattr(type(obj), "checkpointed", True) is False:  # scratch that is never saved
        return
    seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        for name, t in list(obj.named_parameters()) + list(obj.named_buffers()):
            yield from _walk(t, f"{path}.{name}", seen)
        return
    if isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            yield from _walk(item, f"{path}[{i}]", seen)
        return
    if isinstance(obj, dict):
        for key, item in obj.items():
            if isinstance(key, (str, int)):
                yield from _walk(item, f"{path}[{key!r}]", seen)
        return
    if isinstance(obj, (torch.Generator, torch.optim.Optimizer)) or not hasattr(obj, "__dict__"):
        return
    for name, item in vars(obj).items():
        yield from _walk(item, f"{path}.{name}", seen)


def check_plain(value: Any, where: str = "checkpoint") -> None:
    """Raise TypeError naming the first entry of ``value`` (as ``where[key]...``) that is neither a
    tensor nor plain data (:data:`PLAIN`, lists, tuples, dicts with str or int keys)."""
    if isinstance(value, torch.Tensor) or (isinstance(value, PLAIN) and type(value) in PLAIN):
        return
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        for i, item in enumerate(value):
            check_plain(item, f"{where}[{i}]")
        return
    if type(value) in (dict, OrderedDict):  # state_dict()s are OrderedDicts
        for key, item in value.items():
            if type(key) not in (str, int):
                raise TypeError(f"{where}: key {key!r} of type {type(key).__name__} (str or int keys only)")
            check_plain(item, f"{where}[{key!r}]")
        return
    raise TypeError(f"{where} is a {type(value).__module__}.{type(value).__qualname__}; a checkpoint holds "
                    "tensors and plain data only (numbers, strings, booleans, None, lists, tuples, dicts)")


def encode(payload: dict) -> bytes:
    """The bytes of a checkpoint file of ``payload`` (header and body, the module docstring).

    Raises:
        TypeError: ``payload`` holds more than tensors and plain data (:func:`check_plain`).
    """
    check_plain(payload)
    return encode_packed(pack(payload))


def encode_packed(body: dict) -> bytes:
    """The bytes of a checkpoint file whose body is ``body``, a packed payload (:func:`pack`'s
    result, or one member's share of it with ``members``: its row of each buffer, a copy)."""
    buffer = io.BytesIO()
    torch.save(body, buffer)
    data = buffer.getbuffer()  # no copy: the body is copied once, into the file's bytes
    header = json.dumps({"format": FORMAT, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)})
    return b"".join((MAGIC, header.encode(), b"\n", data))


def pack(payload: dict, members: int | None = None) -> dict:
    """The body of a format-5 file (module docstring): ``payload`` with None in place of each tensor
    (containers copied only where one was), each tensor's ``[keys, dtype, offset, shape]`` (the
    dict keys and list indices that reach it, its dtype's name, its offset in that dtype's buffer),
    and the buffers, every tensor flattened into its dtype's (CPU, detached).

    ``members``: every tensor of ``payload`` has a leading axis of that many members, the same
    payload's tensors for each; the index then gives one member's shapes and offsets, and each
    buffer is ``[members, n]``, member m's body being row m of each."""
    packed, index, flats = pack_parts(payload, members)
    return {"packed": packed, "tensors": index, "buffers": {name: torch.cat(f, dim=-1) for name, f in flats.items()}}


def pack_parts(payload: dict, members: int | None = None) -> tuple[Any, list, dict[str, list[torch.Tensor]]]:
    """:func:`pack`'s body before its buffers are joined: ``(packed, index, flats)``, where
    ``flats[dtype]`` lists that dtype's tensors flattened (CPU, detached; ``[members, n_i]`` with
    ``members``, views where the tensor was contiguous) in buffer order: the buffer is their
    concatenation along the last axis. With ``members``, member m's buffer is therefore
    ``torch.cat([f[m] for f in flats[dtype]])``, which
    :func:`foxdqn.population.checkpoint_batch.member_files` builds member by member, never holding
    the ``[members, n]`` buffer."""
    index, flats, sizes = [], {}, {}

    def walk(obj: Any, keys: tuple) -> Any:  # keys: (parent's keys, key), flattened only at a tensor
        if type(obj) in _LEAVES:
            return obj
        if isinstance(obj, torch.Tensor):
            name, path = str(obj.dtype).removeprefix("torch."), []
            while keys:
                keys, key = keys
                path.append(key)
            shape = list(obj.shape) if members is None else list(obj.shape[1:])
            flat = obj.detach().reshape(-1 if members is None else (members, math.prod(shape))).to("cpu")
            index.append([path[::-1], name, sizes.get(name, 0), shape])
            flats.setdefault(name, []).append(flat)
            sizes[name] = sizes.get(name, 0) + math.prod(shape)
            return None
        if isinstance(obj, dict):
            items = [(k, v, walk(v, (keys, k))) for k, v in obj.items()]
        elif isinstance(obj, (list, tuple)):
            items = [(i, v, walk(v, (keys, i))) for i, v in enumerate(obj)]
        else:
            return obj
        if all(new is old for _, old, new in items):
            return obj
        if isinstance(obj, dict):
            return type(obj)((k, new) for k, _, new in items)
        return type(obj)(new for _, _, new in items)

    return walk(payload, ()), index, flats


def _unpack(body: Any, path: str | Path) -> Any:
    """The payload of a format-5 ``body`` (:func:`pack`), each tensor a copy of its slice of its
    dtype's buffer.

    Raises:
        ConfigError: the body is not a packed body or its index does not fit its buffers or its
            payload (names the path).
    """
    def damaged(why: str) -> ConfigError:
        return ConfigError(f"checkpoint {path}: its packed tensors are damaged ({why}); the file is corrupt")

    if not isinstance(body, dict) or set(body) != {"packed", "tensors", "buffers"}:
        raise damaged("not a packed body")
    buffers, at = body["buffers"], {}
    if not isinstance(buffers, dict) or not isinstance(body["tensors"], list):
        raise damaged("no index or buffers")
    for entry in body["tensors"]:
        try:
            keys, name, offset, shape = entry
            keys = tuple(keys)
            buf, size = buffers[name], math.prod(shape)
            ok = (all(type(k) in (str, int) for k in keys) and type(offset) is int and offset >= 0
                  and all(type(d) is int and d >= 0 for d in shape) and buf.dim() == 1
                  and str(buf.dtype) == f"torch.{name}" and offset + size <= buf.numel())
        except (TypeError, ValueError, KeyError, AttributeError):
            ok = False
        if not ok or keys in at:
            raise damaged(f"entry {str(entry)[:80]}")
        at[keys] = buf[offset:offset + size].view(shape).clone()
    prefixes = {keys[:i] for keys in at for i in range(len(keys))}
    placed = []

    def rebuild(obj: Any, keys: tuple) -> Any:
        if keys in at:
            if obj is not None:
                raise damaged(f"a tensor where the payload holds a value, at {list(keys)}")
            placed.append(keys)
            return at[keys]
        if keys not in prefixes:
            return obj
        if isinstance(obj, dict):
            return type(obj)((k, rebuild(v, (*keys, k))) for k, v in obj.items())
        if isinstance(obj, (list, tuple)):
            return type(obj)(rebuild(v, (*keys, i)) for i, v in enumerate(obj))
        return obj

    payload = rebuild(body["packed"], ())
    if len(placed) != len(at):
        raise damaged(f"{len(at) - len(placed)} tensors whose keys the payload does not have")
    return payload


def write_payload(path: str | Path, payload: dict) -> Path:
    """Write ``payload`` as a checkpoint file (:func:`encode`) to ``path``, atomically (parent
    folders are created).

    Raises:
        OSError: the file cannot be written (names the path; nothing is left behind).
        TypeError: as :func:`encode`.
    """
    write_bytes_atomic(path, encode(payload))
    return Path(path)


#: The first bytes of a plain ``torch.save`` file (a zip archive, or a legacy pickle).
_PICKLED = (b"PK\x03\x04", b"\x80\x02", b"\x80\x04", b"\x80\x05")


def decode(data: bytes, path: str | Path, map_location="cpu") -> dict:
    """The payload of the checkpoint file bytes ``data`` (read from ``path``, named in errors):
    header and SHA-256 checked first, then the body loaded with ``weights_only=True``.

    Raises:
        ConfigError: a foreign file, an older foxdqn's pickle (with the upgrade command), a
            newer format, or a body whose size or SHA-256 does not match its header.
    """
    if not data.startswith(MAGIC):
        if data.startswith(_PICKLED):
            raise ConfigError(f"checkpoint {path}: a plain pickle (an older foxdqn wrote its checkpoints so), which "
                              "can run code when loaded, so it is not read; convert an older foxdqn checkpoint once "
                              f"with: python -m foxdqn.run.checkpoint upgrade {path} (it reads only tensors, plain data "
                              "and the classes such a checkpoint holds, and refuses anything else)")
        raise ConfigError(f"checkpoint {path}: not a foxdqn checkpoint (it does not start with "
                          f"{MAGIC.decode().strip()})")
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + 4096)
    try:
        header = json.loads(data[len(MAGIC):end]) if end > 0 else None
        form, digest, size = int(header["format"]), str(header["sha256"]), int(header["bytes"])
    except (ValueError, TypeError, KeyError):
        raise ConfigError(f"checkpoint {path}: its header is damaged; the file is corrupt") from None
    if form > FORMAT:
        raise ConfigError(f"checkpoint {path}: format {form}, written by a newer foxdqn (this one reads format "
                          f"{FORMAT}); upgrade foxdqn")
    body = data[end + 1:]
    if len(body) != size:
        raise ConfigError(f"checkpoint {path}: {len(body)} bytes of contents where its header says {size}; the "
                          "file is cut short or corrupt")
    if hashlib.sha256(body).hexdigest() != digest:
        raise ConfigError(f"checkpoint {path}: its contents do not match their SHA-256 in the header; the file is "
                          "corrupt (changed after it was written)")
    try:
        with warnings.catch_warnings():  # torch warns before it refuses some pickles: the one line says it
            warnings.simplefilter("ignore")
            payload = torch.load(io.BytesIO(body), map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a body that passed the hash but holds more than tensors and data
        raise ConfigError(f"checkpoint {path}: not a readable checkpoint ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:120] if str(exc) else ''})") from None
    return _unpack(payload, path) if form >= PACKED else payload


def load_checkpoint(path: str | Path, map_location="cpu") -> dict:
    """Read a checkpoint file (:func:`write_payload`'s; ``online`` always present); nothing in
    the file is executed (:func:`decode`).

    Raises:
        ConfigError: the file is missing, unreadable, corrupt, an older foxdqn's pickle, or not a
            foxdqn checkpoint (names the path).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"checkpoint {path}: no such file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"checkpoint {path}: cannot be read ({exc.strerror or exc})") from None
    payload = decode(data, path, map_location)
    if not isinstance(payload, dict) or "online" not in payload or "config" not in payload:
        raise ConfigError(f"checkpoint {path}: not a foxdqn checkpoint (no online weights and config)")
    payload["config"] = upgrade(payload["config"])
    return payload


def plain_data(value: Any) -> Any:
    """``value`` with what an older foxdqn pickled into a checkpoint turned into plain data: numpy
    scalars into Python numbers, objects with a ``state_dict()`` (the early stopper, the collapse
    monitor) into it, tuples kept, dicts and lists walked."""
    if isinstance(value, (torch.Tensor, str, bytes, type(None))):
        return value
    for kind in (bool, int, float):  # np.float64 is a float: turned into the float itself
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, dict):
        return {k: plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return (tuple if isinstance(value, tuple) else list)(plain_data(v) for v in value)
    if callable(getattr(value, "state_dict", None)):
        return plain_data(value.state_dict())
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item) and type(value).__module__.startswith("numpy"):
        return item()
    raise TypeError(f"cannot convert a {type(value).__qualname__} to plain data")


def _old_globals() -> list:
    """The classes an older foxdqn (format 3 and before) pickled into a checkpoint besides tensors
    and plain data: the early stopper and collapse monitor of its loop state, the config classes and
    choices the stopper holds, numpy's scalars (a float64 loop value) and dtypes."""
    import dataclasses

    import numpy as np

    # start-up: the package foxdqn.logger imports rich, which foxdqn.evaluate's load of a checkpoint
    # (run.resume imports this module) does without
    from foxdqn.logger.diversity import CollapseMonitor

    config_types = [v for v in vars(C).values() if isinstance(v, type) and v.__module__ == C.__name__
                    and (dataclasses.is_dataclass(v) or issubclass(v, C.Choice))]
    core = getattr(np, "_core", None) or np.core
    return [EarlyStopper, CollapseMonitor, *config_types, core.multiarray.scalar, np.dtype, *{type(np.dtype(t)) for t in (
        np.float64, np.float32, np.int64, np.bool_)}]


def upgrade_file(path: str | Path, out: str | Path | None = None) -> Path:
    """Convert an older foxdqn's checkpoint (a pickle) at ``path`` into the current format, at
    ``out`` (default: in place, atomically). The file is read with ``weights_only=True``, allowing
    only :func:`_old_globals` besides tensors and plain data, so it runs no code: a pickle that
    names any other global (a command, another library's class) is refused and left as it is.

    Returns:
        The path written.

    Raises:
        ConfigError: the file is missing, already current, not a foxdqn checkpoint, or names a
            global outside :func:`_old_globals` (names the file and the global).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"checkpoint {path}: no such file")
    data = path.read_bytes()
    if data.startswith(MAGIC):
        raise ConfigError(f"checkpoint {path}: already in the current format (nothing to upgrade)")
    try:
        with warnings.catch_warnings(), torch.serialization.safe_globals(_old_globals()):
            warnings.simplefilter("ignore")
            payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch's UnpicklingError names the global it refused
        text = str(exc)
        named = next((ln.strip() for ln in text.splitlines() if "GLOBAL" in ln or "global" in ln), "")
        raise ConfigError(f"checkpoint {path}: not an older foxdqn checkpoint, not converted ({type(exc).__name__}"
                          f"{': ' + named[:160] if named else ''})") from None
    if not isinstance(payload, dict) or "online" not in payload or "config" not in payload:
        raise ConfigError(f"checkpoint {path}: not a foxdqn checkpoint (no online weights and config)")
    payload = plain_data(payload)
    if payload.get("format") == 3:  # the same state layout; only the loop state was pickled
        payload["format"] = FORMAT
    return write_payload(Path(out) if out is not None else path, payload)


def main(argv: list[str] | None = None) -> int:
    """``python -m foxdqn.run.checkpoint upgrade PATH [PATH ...]``: convert older foxdqn checkpoints
    (pickles) in place, trusting them (:func:`upgrade_file`). One line per file; exit 2 at the
    first file that cannot be converted."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "upgrade" or any(a.startswith("-") for a in args[1:]):
        print("usage: python -m foxdqn.run.checkpoint upgrade PATH [PATH ...]\n"
              "  converts checkpoints written by an older foxdqn (pickles) into the current format, in place;\n"
              "  it reads only what such a checkpoint holds and refuses any other pickle, without running it",
              file=sys.stderr)
        return 2
    for name in args[1:]:
        try:
            written = upgrade_file(name)
        except (ConfigError, TypeError, OSError) as exc:
            print(f"foxdqn: error: {exc}", file=sys.stderr)
            return 2
        print(f"upgraded {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
