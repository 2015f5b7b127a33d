"""Many members' checkpoint files encoded from one pass over a population's host copy.

Member p's checkpoint (:func:`foxdqn.population.checkpoint.member_payload`, packed by
:func:`foxdqn.run.checkpoint.pack`) differs from member q's only in its plain values (config,
counters, run id, loop state) and in the contents of its tensors: the tensors' keys, dtypes and
shapes, hence the packed body's index, are the same for every member. :func:`member_files`
therefore indexes every member's tensors at once: the payload is assembled once with each tensor a
``[P, ...]`` stack of all members' (views of :class:`~foxdqn.population.checkpoint.HostCopy`'s
copies: the networks' ``member_state_dicts``, :func:`~foxdqn.population.checkpoint.member_tensor_stacks`)
and indexed with a member axis (:func:`~foxdqn.run.checkpoint.pack_parts`); then each member's body
is its own plain values around that shared index and its buffers, each the concatenation of its
rows of that dtype's stacks (one copy of its tensors, straight from the host copy). The files are
byte for byte those of :func:`~foxdqn.population.checkpoint.member_payload` and
:func:`~foxdqn.run.checkpoint.encode` (``tests/population/test_checkpoint_batch.py``), at a
fraction of their host time: the per-tensor slicing and indexing of each member (about 1.9 of 3.3
ms per ``cartpole_cleanrl`` member on a 2-core CPU) is done once (docs/bench.md#population).

The replay (``checkpoint.save_replay``) stays on the device and is read member by member:
populations that save it write their files through ``member_payload``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch

from foxdqn.io_atomic import write_bytes_atomic
from foxdqn.population.checkpoint import HostCopy, assemble_payload, member_tensor_stacks
from foxdqn.run.checkpoint import encode_packed, pack_parts

__all__ = ["member_files", "write_member_files"]


def member_files(s, host: HostCopy, members: list[dict]) -> Iterator[tuple[int, bytes]]:
    """(p, the bytes of member p's checkpoint file) for every member of population ``s``, in order:
    what ``encode(member_payload(s, p, host=host, **members[p]))`` returns, with ``members[p]``
    the keyword arguments ``counts``, ``run_id``, ``loop``, ``config`` (never ``nets``: the
    networks are ``s``'s, read from ``host``; ``best``: ``host``'s). Reads ``host`` only, never the
    device, so it may run in another thread while training goes on. Host memory: one member's
    buffers at a time, besides ``host``.

    Raises:
        ValueError: ``len(members)`` is not ``s.members``, some members have a ``loop`` and others
            not, a member saves its replay (``checkpoint.save_replay``), or a tensor has no host copy.
    """
    if len(members) != s.members:
        raise ValueError(f"member_files: {len(members)} members' arguments for a population of {s.members}")
    if len({kw.get("loop") is None for kw in members}) > 1:
        raise ValueError("member_files: either every member's file is resumable (a loop) or none is")
    if any(cfg.checkpoint.save_replay for cfg in s.cfgs):
        raise ValueError("member_files: checkpoint.save_replay reads the replay from the device, member by "
                         "member (foxdqn.population.checkpoint.member_payload)")
    if not s.members:
        return
    nets = tuple(host.twin(net) for net in (s.online, s.target, s.value))
    states = tuple(None if net is None else net.member_state_dicts() for net in nets)
    tensors = member_tensor_stacks(s, host)
    for t in [*(t for d in states if d is not None for t in d.values()), *tensors.values()]:
        if t.device.type != "cpu":  # HostCopy's twins and copies are CPU tensors: a bug otherwise
            raise ValueError(f"member_files: a {t.device} tensor in the host copy")
    _, index, flats = pack_parts(assemble_payload(s, 0, states, tensors, host=host, **members[0]), members=s.members)
    blanks = (tuple(None if d is None else dict.fromkeys(d) for d in states), dict.fromkeys(tensors))
    for p in range(s.members):
        packed = assemble_payload(s, p, blanks[0], blanks[1], host=host, **members[p])
        yield p, encode_packed({"packed": packed, "tensors": index,
                                "buffers": {name: torch.cat([f[p] for f in fs]) for name, fs in flats.items()}})


def write_member_files(s, host: HostCopy, paths: list[Path], members: list[dict]) -> list[Path]:
    """Write :func:`member_files` to ``paths`` (member p's to ``paths[p]``), each atomically;
    returns ``paths``.

    Raises:
        OSError: a file cannot be written (names the path; the files before it stay).
        ValueError: as :func:`member_files`.
    """
    for p, data in member_files(s, host, members):
        write_bytes_atomic(paths[p], data)
    return list(paths)
