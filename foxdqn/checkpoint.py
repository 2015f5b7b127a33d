"""Checkpoints: everything a run needs to continue, written atomically.

A checkpoint (``torch.save`` of a dict, written through :func:`foxdqn.io_atomic.write_bytes_atomic`
so that a crash or a full disk never leaves a partial file or a ``.tmp`` behind) holds:

* ``online``, ``target``, ``optimizer``: the networks' and Adam's ``state_dict``;
* ``env_steps``, ``updates``: the device counters (ints);
* ``config``: the resolved config (:func:`foxdqn.config.to_plain`; read back through
  :func:`foxdqn.config.upgrade`, so a checkpoint written before keys moved still loads);
* ``tensors``: every other tensor of the :class:`~foxdqn.step.state.TrainState`, found by walking
  its parts (env state, schedules, device accumulators, guard and Q-monitor state, target-update
  parameters, PER tree, pruning masks, the observation to act on), each tensor once, keyed by its
  attribute path (e.g. ``monitors.guard.acc``, ``rollout.obs``); the replay memory only with
  ``save_replay`` (it is most of the run's memory);
* ``generators``: the state of the run's ``torch.Generator`` and of torch's global CPU/CUDA RNGs;
* ``loop``: the host loop's own state (early stopper, collapse monitor, ...), any picklable dict;
* ``format``: :data:`FORMAT`.

:func:`restore_state` copies a checkpoint into a freshly built state of the same config (same
shapes): resuming then replays exactly what the interrupted run would have done (on CPU, bit for
bit when the replay was saved; tested). Reading the counters is a host sync: checkpoints are taken
at log boundaries and at the end, never inside the steady-state loop.
"""
from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any, Iterator

import torch

from foxdqn.config import to_plain, upgrade
from foxdqn.errors import ConfigError
from foxdqn.io_atomic import write_bytes_atomic

FORMAT = 3  # 3: keys of the TrainState parts (nets., rollout., monitors., ...); parameters stored once
_OWN = ("cfg", "device", "generator", "env_steps", "updates")  # saved as their own entries
_SKIP_TYPES = (str, bytes, int, float, bool, type(None), torch.device, torch.dtype)


def _walk(obj: Any, path: str, seen: set[int]) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor reachable from ``obj`` (attributes, lists, tuples, dicts, modules), once each."""
    if isinstance(obj, torch.Tensor):
        if id(obj) not in seen:
            seen.add(id(obj))
            yield path, obj
        return
    if isinstance(obj, _SKIP_TYPES) or id(obj) in seen or callable(obj) and not hasattr(obj, "__dict__"):
        return
    if getattr(type(obj), "checkpointed", True) is False:  # scratch (WeightCheck), or saved apart (step.adam.Adam)
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


def state_tensors(state, save_replay: bool = True) -> dict[str, torch.Tensor]:
    """The tensors of ``state`` that :func:`restore_state` puts back, by attribute path."""
    seen: set[int] = set()
    for module in (state.nets.online, state.nets.target):  # saved through their state_dict
        seen.update(id(t) for t in module.parameters())
        seen.update(id(t) for t in module.buffers())
    if not save_replay:
        seen.update(id(t) for _, t in _walk(state.replay, "replay", set()))
    out: dict[str, torch.Tensor] = {}
    for field in dataclasses.fields(state):
        if field.name in _OWN:
            continue
        out.update(_walk(getattr(state, field.name), field.name, seen))
    return out


def save_checkpoint(path: str | Path, state, extra: dict | None = None, *, loop: dict | None = None,
                    save_replay: bool = False) -> Path:
    """Write a checkpoint of ``state`` (:class:`~foxdqn.step.state.TrainState`) to ``path``, atomically.

    Args:
        path: destination file (parent folders are created).
        state: the run's state.
        extra: more top-level entries (e.g. ``{"best": ...}``).
        loop: the host loop's state (picklable), restored by the caller on resume.
        save_replay: include the replay memory (needed for an exact continuation).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        OSError: the folder cannot be written (nothing is left behind).
    """
    path = Path(path)
    payload = {
        "format": FORMAT,
        "online": state.nets.online.state_dict(),
        "target": state.nets.target.state_dict(),
        "optimizer": state.optim.optimizer.state_dict(),
        "env_steps": int(state.env_steps.item()),
        "updates": int(state.updates.item()),
        "config": to_plain(state.cfg),
        "tensors": {k: v.detach().cpu().clone() for k, v in state_tensors(state, save_replay).items()},
        "replay_saved": bool(save_replay),
        "generators": {"run": state.generator.get_state(), "cpu": torch.get_rng_state(),
                       "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
        "loop": loop or {},
        **(extra or {}),
    }
    return write_payload(path, payload)


def write_payload(path: str | Path, payload: dict) -> Path:
    """``torch.save`` of ``payload`` to ``path``, atomically (parent folders are created).

    Raises:
        OSError: the folder cannot be written (nothing is left behind).
    """
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    write_bytes_atomic(path, buffer.getvalue())
    return Path(path)


def load_checkpoint(path: str | Path, map_location="cpu") -> dict:
    """Read a checkpoint written by :func:`save_checkpoint` (any format; ``online`` always present).

    Raises:
        ConfigError: the file is missing, unreadable, or not a foxdqn checkpoint (names the path).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"checkpoint {path}: no such file")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as exc:  # noqa: BLE001 - truncated, corrupt or foreign pickles
        raise ConfigError(f"checkpoint {path}: not a readable checkpoint ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:120] if str(exc) else ''})") from None
    if not isinstance(payload, dict) or "online" not in payload or "config" not in payload:
        raise ConfigError(f"checkpoint {path}: not a foxdqn checkpoint (no online weights and config)")
    payload["config"] = upgrade(payload["config"])
    return payload


def _upgrade_ring(value: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """A record ring saved before the records grew from 16 to 18 columns (the post-step weight
    check's HALT_WEIGHT, MAX_WEIGHT) gets those columns as in a fresh ring (0, -1); anything else
    is returned as it is."""
    from foxdqn.guard import record as R

    if (value.dim() == 2 and tensor.dim() == 2 and value.shape[0] == tensor.shape[0] and value.shape[1] == 16
            and tensor.shape[1] == R.RECORD_SIZE and value.dtype == tensor.dtype == R.RING_DTYPE):
        fresh = torch.zeros(tensor.shape, dtype=R.RING_DTYPE)
        R.reset_ring(fresh)
        fresh[:, :16] = value
        return fresh
    return value


def restore_state(state, payload: dict) -> None:
    """Copy checkpoint ``payload`` into ``state`` (built from the same config), in place.

    Raises:
        ConfigError: the checkpoint is not a resumable one (older format) or its tensors do not
            match this state's (another config).
    """
    if payload.get("format") != FORMAT:
        raise ConfigError(f"checkpoint: format {payload.get('format')} (an older foxdqn), this one resumes format "
                          f"{FORMAT} only; it can be evaluated but not resumed")
    state.nets.online.load_state_dict(payload["online"])
    state.nets.target.load_state_dict(payload["target"])
    try:
        state.optim.optimizer.load_state_dict(payload["optimizer"])  # copies into the run's lr tensor
    except ValueError as e:
        raise ConfigError(f"checkpoint: its optimizer state does not match this config ({e})") from None
    mine = state_tensors(state, save_replay=payload["replay_saved"])
    saved = payload["tensors"]  # may hold more: scratch buffers made lazily (e.g. a pinned snapshot copy)
    missing = sorted(set(mine) - set(saved))
    if missing:
        raise ConfigError(f"checkpoint: its training state does not match this config (no {', '.join(missing[:3])})")
    with torch.no_grad():
        for name, tensor in mine.items():
            value = _upgrade_ring(saved[name], tensor)
            if value.shape != tensor.shape or value.dtype != tensor.dtype:
                raise ConfigError(f"checkpoint: {name} has shape {tuple(value.shape)} {value.dtype}, this config "
                                  f"{tuple(tensor.shape)} {tensor.dtype}")
            tensor.copy_(value)
        state.env_steps.fill_(int(payload["env_steps"]))
        state.updates.fill_(int(payload["updates"]))
    gens = payload["generators"]  # RNG states are CPU byte tensors, whatever map_location the payload was read with
    if gens["run"].numel() != state.generator.get_state().numel():
        raise ConfigError(f"checkpoint: its random generator is not a {state.device.type} generator (the run was "
                          f"trained on another device); resume it with the device it was trained on")
    state.generator.set_state(gens["run"].cpu())
    torch.set_rng_state(gens["cpu"].cpu())
    if gens.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([g.cpu() for g in gens["cuda"]])
