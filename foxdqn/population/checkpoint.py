"""A population member's resumable checkpoint: its slice of the population's state.

Member p's ``checkpoints/last.pt`` (:func:`member_checkpoint` with
``loop``) holds, beside its weights in a single run's layout (so ``python -m foxdqn.evaluate``
reads it), ``member_state``: every tensor of the :class:`~foxdqn.population.state.PopulationState`
(and of the kept best weights, early stopping) cut to member p (:func:`member_tensors`), plus the
host loop's state. A population resumes by gathering its members' files: :func:`restore_member`
copies member p's slice into any position of a freshly built population of the same group key, so
the members may come back in another order or another grouping and each continues bit for bit
(on CPU) what it would have done.

Each tensor's member layout comes from :data:`LAYOUT` (its attribute path, first match):

* ``member``: a member axis ``dim`` of ``width`` entries per member (1: ``[P, ...]``; ``"envs"``:
  the member's ``env.num_envs`` columns of ``[P·N, ...]``, member-major);
* ``shared``: the same for every member (counters, bars, schedules): saved whole in every slice,
  restored from the slice (the counters are equal in every member's slice of one checkpoint);
* ``position``: values that depend on the member's index in its population (its env ids, its first
  ring column): never saved, rebuilt by :func:`~foxdqn.population.state.build_population`;
* ``scratch``: buffers every step overwrites before reading (``env=gym``'s host staging buffers):
  never saved. The Gymnasium envs' own state lives in Python objects on the host, not in tensors: a
  resumed ``env=gym`` population restarts their episodes (its replay, weights and counters continue).

A tensor no rule names is an error (:class:`LayoutError`), so new state cannot be left out silently
(``tests/population/test_population_resume.py`` walks every supported setting). Without
``checkpoint.save_replay`` the replay (``replay.*``) is left out, as a single run leaves it out.
"""
from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from typing import Iterator

import torch

from foxdqn.config.schema import to_plain
from foxdqn.errors import ConfigError
from foxdqn.run.checkpoint import FORMAT, _walk, write_payload

MEMBER, SHARED, POSITION, SCRATCH = "member", "shared", "position", "scratch"
ENVS = "envs"  # width: the member's env.num_envs columns

#: (attribute path regex, kind, member dim, width), first match wins.
LAYOUT: tuple[tuple[str, str, int, int | str], ...] = (
    # network buffers that are the same for every member (IQN's cosine basis and policy fractions)
    (r"^(online|target|value|best\[\d+\])\.(pi_i|policy_taus)$", SHARED, 0, 1),
    (r"^(online|target|value|best\[\d+\])\.", MEMBER, 0, 1),
    (r"^(optimizer|weight_check|params|stats|switch)\.", MEMBER, 0, 1),
    (r"^eps_duration$", MEMBER, 0, 1),
    (r"^rng\.keys$", MEMBER, 0, 1),
    (r"^rng\.", SHARED, 0, 1),
    (r"^guard\.host$", MEMBER, 1, 1),
    (r"^guard\.", MEMBER, 0, 1),
    (r"^pruner\.masks\[\d+\]$", MEMBER, 0, 1),
    # k of each mask step, built from the schedule (ops/prune_masks.py): not saved, so a checkpoint
    # written before the table existed resumes
    (r"^pruner\.k_table$", SCRATCH, 0, 1),
    (r"^pruner\.", SHARED, 0, 1),
    (r"^obs$", MEMBER, 0, ENVS),
    (r"^env\._first_path$", POSITION, 0, 1),
    (r"^env\._(obs|next|scalars)_host$", SCRATCH, 0, 1),
    # the envs' own state: trading (position, account, episode), CartPole (state, steps), bit flipping (state, goal)
    (r"^env\.(t|steps|cash|units|entry_price|equity|exposure_idx|episode_return|_frozen|state|goal)$", MEMBER, 0, ENVS),
    (r"^env\.", SHARED, 0, 1),
    (r"^(env_steps|updates)$", SHARED, 0, 1),
    (r"^action_mode\.", SHARED, 0, 1),
    (r"^replay\.priorities\._env_ids$", POSITION, 0, 1),
    (r"^replay\._first_column$", POSITION, 0, 1),
    (r"^replay\.priorities\.per\.", MEMBER, 0, 1),
    # the draw's filled slots and β, rewritten before each draw (ops/per_schedule.py)
    (r"^replay\.priorities\._(size|beta)$", SCRATCH, 0, 1),
    (r"^replay\._member_gamma_m$", MEMBER, 0, 1),
    (r"^replay\._episode_now$", MEMBER, 0, ENVS),
    (r"^replay\.(obs|next_obs|action|reward|terminal|ended|episode|vol_ratio)$", MEMBER, 1, ENVS),
    (r"^replay\.", SHARED, 0, 1),
)
_COMPILED = tuple((re.compile(rx), kind, dim, width) for rx, kind, dim, width in LAYOUT)


class LayoutError(RuntimeError):
    """A state tensor that :data:`LAYOUT` does not name (a bug: new state needs a rule)."""


def layout(path: str) -> tuple[str, int, int | str]:
    """(kind, member dim, width) of the state tensor at attribute path ``path`` (:data:`LAYOUT`).

    Raises:
        LayoutError: no rule names ``path``.
    """
    for rx, kind, dim, width in _COMPILED:
        if rx.search(path):
            return kind, dim, width
    raise LayoutError(f"population state tensor {path}: no member layout (add a rule to "
                      "foxdqn.population.checkpoint.LAYOUT)")


#: the population's counters: named by their own fields in a checkpoint, whatever else holds them, so
#: that they are kept without the replay (``checkpoint.save_replay=false``)
COUNTERS = ("env_steps", "updates")


def state_parts(s, best: tuple | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of population ``s`` (and of ``best``, the kept best networks of early stopping,
    as ``best[i].*``), by attribute path, each once (the counters :data:`COUNTERS` first, by their
    own names); not the bars an env rebuilds from its config (``env.rebuilt_tensors``: resampled
    training paths)."""
    seen = {id(t) for t in getattr(s.env, "rebuilt_tensors", ())}
    for name in COUNTERS:  # by their own names, before a component that holds them (PER's β reads ``updates``)
        yield from _walk(getattr(s, name), name, seen)
    for field in dataclasses.fields(s):
        if field.name in ("cfg", "cfgs", "device", "generator", "target_branch"):
            continue
        yield from _walk(getattr(s, field.name), field.name, seen)
    for i, net in enumerate(best or ()):
        yield from _walk(net, f"best[{i}]", seen)


def _slice(t: torch.Tensor, p: int, dim: int, width: int) -> torch.Tensor:
    return t.narrow(dim, p * width, width)


def _width(width: int | str, envs: int) -> int:
    return envs if width == ENVS else int(width)


def _kept(path: str, kind: str, save_replay: bool) -> bool:
    return kind not in (POSITION, SCRATCH) and (save_replay or not path.startswith("replay."))


def _host(t: torch.Tensor, path: str, pinned: dict[str, torch.Tensor] | None, queued: set) -> torch.Tensor:
    """A contiguous host copy of ``t``: into ``pinned[path]`` (made or remade to ``t``'s shape and
    dtype, page-locked) without waiting, its stream added to ``queued``, for a CUDA tensor with a
    ``pinned`` dict; else a new tensor, copied now."""
    if pinned is None or t.device.type != "cuda":
        return t.to("cpu", copy=True).contiguous()
    buf = pinned.get(path)
    if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
        buf = pinned[path] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    buf.copy_(t, non_blocking=True)
    queued.add(torch.cuda.current_stream(t.device))
    return buf


class HostCopy:
    """Population ``s``'s checkpointed state read to the host once, for all its members'
    checkpoints: each tensor of :func:`state_parts` that a member's slice takes (not the
    ``position`` and ``scratch`` ones), with its layout; the replay's stay on the device and are
    read member by member (:func:`member_tensors`), so that the host never holds a whole
    population's replay; the others are copied whole to the CPU (one device read per tensor
    instead of one per member), with the population's counters. Reads the device: build it at a
    boundary, never inside the captured loop.

    With ``pinned`` (a dict the caller keeps from one copy to the next), CUDA tensors are copied
    into page-locked host buffers, one per path, made on the first copy and reused by the later
    ones: all copies are queued at once and waited for once, instead of a pageable copy that waits
    per tensor (docs/bench.md#the-loops-host-time). A reused buffer is overwritten, so the copy that used it before must no longer
    be read (:meth:`foxdqn.population.train._Population.save` waits for the writer first).

    Attributes:
        parts: ``[(path, kind, member dim, width, device tensor, CPU copy or None)]``.
        env_steps, updates: the population's counters (equal for every member).
    """

    def __init__(self, s, best: tuple | None = None, pinned: dict[str, torch.Tensor] | None = None):
        self.parts, self._by_id, self._twins = [], {}, {}  # _by_id: id(device tensor) → its CPU copy
        queued = set()  # the streams of the copies queued without waiting
        for path, t in state_parts(s, best):
            kind, dim, width = layout(path)
            if not _kept(path, kind, save_replay=True):
                continue
            host = None
            if not path.startswith("replay."):
                host = self._by_id[id(t)] = _host(t.detach(), path, pinned, queued)
            self.parts.append((path, kind, dim, width, t, host))
        for stream in queued:
            stream.synchronize()
        self.env_steps, self.updates = int(s.env_steps.item()), int(s.updates.item())

    def twin(self, net: torch.nn.Module | None) -> torch.nn.Module | None:
        """``net`` (None: None) with every parameter and buffer its host copy: a shallow copy of its
        module tree whose parameter and buffer dicts are new, so ``member_state_dict`` reads the
        host and the network itself is never touched (another thread may build payloads from the
        twin while this one trains ``net``). Built once per network. A tensor is matched by
        identity, not by its path: :func:`state_parts` names each tensor once, by the first path
        that reaches it (the IQL value network's parameters, for one, as ``optimizer.params[i]``).

        Raises:
            ValueError: a parameter or buffer of ``net`` has no host copy (a network this copy was
                not taken of: its twin would read the device).
        """
        if net is None:
            return None
        if id(net) not in self._twins:
            self._twins[id(net)] = self._twin(net, type(net).__name__)
        return self._twins[id(net)]

    def _twin(self, module: torch.nn.Module, where: str) -> torch.nn.Module:
        twin = copy.copy(module)
        for store in ("_parameters", "_buffers"):
            own, host = getattr(module, store), {}
            for key, t in own.items():
                if t is not None and id(t) not in self._by_id:
                    raise ValueError(f"{where}.{key}: no host copy of this tensor (HostCopy of another population?)")
                host[key] = None if t is None else self._by_id[id(t)]
            setattr(twin, store, host)
        twin._modules = {key: None if child is None else self._twin(child, f"{where}.{key}")
                         for key, child in module._modules.items()}
        return twin


def member_tensors(s, p: int, save_replay: bool, best: tuple | None = None,
                   host: HostCopy | None = None) -> dict[str, torch.Tensor]:
    """Member ``p``'s slice of population ``s``: ``{path: CPU tensor}`` (compact copies; a
    ``shared`` tensor whole) for every tensor of :func:`state_parts` but the ``position`` and
    ``scratch`` ones (and ``replay.*`` unless ``save_replay``), from ``host`` (a
    :class:`HostCopy` of ``s`` and ``best``) where it holds the tensor, else read from the device
    (call at a boundary, never inside the captured loop).

    Raises:
        LayoutError: a tensor without a rule.
    """
    envs, out = s.cfg.env.num_envs, {}
    parts = host.parts if host is not None else (
        (path, *layout(path), t, None) for path, t in state_parts(s, best))
    for path, kind, dim, width, t, copy in parts:
        if not _kept(path, kind, save_replay):
            continue
        if copy is not None:
            out[path] = copy if kind == SHARED else _slice(copy, p, dim, _width(width, envs)).clone()
            continue
        part = t if kind == SHARED else _slice(t, p, dim, _width(width, envs))
        out[path] = part.detach().to("cpu", copy=True).contiguous()
    return out


def member_tensor_stacks(s, host: HostCopy) -> dict[str, torch.Tensor]:
    """Every member's :func:`member_tensors` at once (without the replay): ``{path: CPU tensor
    [P, ...]}``, entry p of each being member p's slice (views of ``host``'s copies; a ``shared``
    tensor expanded over the members).

    Raises:
        ValueError: a tensor it needs has no host copy (``host`` read only the replay from the device).
    """
    envs, members, out = s.cfg.env.num_envs, s.members, {}
    for path, kind, dim, width, _, copy in host.parts:
        if not _kept(path, kind, save_replay=False):
            continue
        if copy is None:
            raise ValueError(f"{path}: no host copy of this tensor (HostCopy of another population?)")
        if kind == SHARED:
            out[path] = copy.unsqueeze(0).expand(members, *copy.shape)
        else:
            out[path] = copy.unflatten(dim, (members, _width(width, envs))).movedim(dim, 0)
    return out


def restore_member(s, p: int, saved: dict[str, torch.Tensor], save_replay: bool, where: str,
                   best: tuple | None = None) -> None:
    """Copy a member's slice ``saved`` (:func:`member_tensors`) into member ``p`` of population
    ``s`` (and of ``best``), in place. ``where`` names the checkpoint in errors.

    Raises:
        ConfigError: the slice lacks a tensor or holds one of another shape or dtype (another
            config, or a checkpoint that was not written with this population's settings).
    """
    envs = s.cfg.env.num_envs
    with torch.no_grad():
        for path, t in state_parts(s, best):
            kind, dim, width = layout(path)
            if not _kept(path, kind, save_replay):
                continue
            dst = t if kind == SHARED else _slice(t, p, dim, _width(width, envs))
            value = saved.get(path)
            if value is None:
                raise ConfigError(f"resume: checkpoint {where} does not hold {path}; it was not written by a "
                                  "population of these settings")
            if value.shape != dst.shape or value.dtype != dst.dtype:
                raise ConfigError(f"resume: checkpoint {where}: {path} has shape {tuple(value.shape)} {value.dtype}, "
                                  f"this population {tuple(dst.shape)} {dst.dtype}")
            dst.copy_(value)


def member_counts(s, p: int) -> tuple[int, int]:
    """(env steps, updates applied) of member ``p``: the population's counters, or where the
    member halted or stopped (its weights are those of that point)."""
    halt = s.guard.halt_point(p)
    return halt if halt is not None else (int(s.env_steps.item()), int(s.updates.item()))


def member_payload(s, p: int, nets: tuple | None = None, counts: tuple[int, int] | None = None,
                   *, run_id: str | None = None, loop: dict | None = None, best: tuple | None = None,
                   host: HostCopy | None = None, config: dict | None = None) -> dict:
    """Member ``p``'s checkpoint payload (:func:`member_checkpoint` writes it): its online and
    target weights in a single run's layout (with ``objective.iql`` also ``iql_value``, its value network's weights in
    :class:`foxdqn.nn.iql_value.IQLValueNetwork`'s layout), its config and counters
    (:func:`member_counts`), ``population`` (member index, size) and ``run_id`` (its run folder's
    id). It evaluates like any checkpoint (``python -m foxdqn.evaluate``).

    With ``loop`` (the host loop's state of this member, plain data) it is also resumable:
    ``member_state`` holds member p's slice of the population (:func:`member_tensors`, the replay
    with ``checkpoint.save_replay``; the kept best networks ``best`` of early stopping), the
    population's counters (``env_steps``, ``updates``: equal in every member's slice), whether the
    replay is in it (``replay_saved``) and ``loop``. Without ``loop`` it holds weights only (a
    ``best.pt``, or the weights ``nets`` with their ``counts``, e.g. the kept best).

    ``host`` (a :class:`HostCopy` of ``s`` with the same ``best``; the networks ``nets`` are then
    ``best``'s) and ``config`` (``to_plain(s.cfgs[p])``) let the checkpoints of many members share
    one read of the device and one conversion of each config; the file is the same without them.
    The payload holds CPU tensors and plain data that training never changes (``loop`` and
    ``config`` are the caller's: it must not change them afterwards), so another thread may write
    it while training goes on.
    """
    online, target, *value = nets if nets is not None else (s.online, s.target, s.value)
    nets = (online, target, value[0] if value else None)
    if host is not None:
        nets = tuple(host.twin(net) for net in nets)
    states = tuple(None if net is None else net.member_state_dict(p) for net in nets)
    tensors = None if loop is None else member_tensors(s, p, bool(s.cfgs[p].checkpoint.save_replay), best, host)
    return assemble_payload(s, p, states, tensors, counts, run_id=run_id, loop=loop, host=host, config=config)


def assemble_payload(s, p: int, states: tuple, tensors: dict | None, counts: tuple[int, int] | None = None, *,
                     run_id: str | None = None, loop: dict | None = None, host: HostCopy | None = None,
                     config: dict | None = None) -> dict:
    """Member ``p``'s payload (:func:`member_payload`, same keyword arguments) around the tensors
    given: ``states`` the (online, target, IQL value or None) networks' state dicts, ``tensors``
    :func:`member_tensors` (used with ``loop`` only). Any tensor-valued dict may hold something
    else in each tensor's place (:mod:`foxdqn.population.checkpoint_batch` passes every member's
    tensors at once, or None); the rest of the payload is member ``p``'s."""
    if counts is None and host is not None and s.guard.halt_point(p) is None:
        counts = host.env_steps, host.updates
    env_steps, updates = counts if counts is not None else member_counts(s, p)
    payload = {
        "format": FORMAT,
        "online": states[0],
        "target": states[1],
        "env_steps": env_steps,
        "updates": updates,
        "config": config if config is not None else to_plain(s.cfgs[p]),
        "run_id": run_id,
        "population": {"member": p, "size": s.members},
    }
    if states[2] is not None:
        payload["iql_value"] = states[2]
    if loop is not None:
        payload["member_state"] = {
            "tensors": tensors, "replay_saved": bool(s.cfgs[p].checkpoint.save_replay), "loop": loop,
            "env_steps": host.env_steps if host is not None else int(s.env_steps.item()),
            "updates": host.updates if host is not None else int(s.updates.item())}
    return payload


def member_checkpoint(s, p: int, path: Path, nets: tuple | None = None, counts: tuple[int, int] | None = None,
                      **kwargs) -> Path:
    """Write member ``p``'s checkpoint (:func:`member_payload`, same arguments) to ``path``,
    atomically; returns ``path``.

    Raises:
        OSError: the file cannot be written (names the path; nothing is left behind).
    """
    return write_payload(path, member_payload(s, p, nets, counts, **kwargs))


def is_member_state(payload: dict | None) -> bool:
    """``payload`` (a loaded checkpoint) is a population member's resumable slice (:func:`member_checkpoint`
    with ``loop``)."""
    return isinstance(payload, dict) and "member_state" in payload
