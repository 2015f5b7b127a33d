"""Continuing a population from its members' checkpoints (``resume=auto``, ``resume=PATH``).

Each member of a resumed multirun is resolved as a single run is (:func:`foxdqn.run.resume.resolve_resume`:
its own folder, start record, run id and the keys given again), so a resume never changes or mixes
a run. :func:`resume_point` tells the launcher which members may continue together (the same
group key and the same point); :func:`restore_members` copies each member's slice
(:mod:`foxdqn.population.checkpoint`) into the freshly built population, in whatever order the
members came back.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from foxdqn.errors import ConfigError
from foxdqn.population.checkpoint import COUNTERS, is_member_state, restore_member

#: resume_point of a member whose payload holds no resumable slice (``member_state``): a checkpoint of
#: the single-run loop an older foxdqn had, which :func:`foxdqn.run.resume.read_checkpoint` refuses
#: before a job gets it; :func:`restore_members` refuses it too
CLASSIC = "classic"


def resume_point(payload: dict | None) -> int | str | None:
    """Where a job continues: None (a new run, or one started over), the population's env steps
    of a member's resumable slice, or :data:`CLASSIC` for a checkpoint without one (never
    restored)."""
    if payload is None:
        return None
    return int(payload["member_state"]["env_steps"]) if is_member_state(payload) else CLASSIC


class Restored(NamedTuple):
    """What :func:`restore_members` restored: the population's counters (env steps of one member,
    updates), whether the replay was in the checkpoints, and each member's host loop state
    (plain data, :meth:`foxdqn.population.train._Population.loop_state`)."""

    env_steps: int
    updates: int
    replay_saved: bool
    loops: list[dict]


def restore_members(s, members: Sequence, best: tuple | None) -> Restored:
    """Copy every member's checkpoint slice (``members[p].payload``) into member p of the built
    population ``s`` (and of the kept best networks ``best``).

    Raises:
        ConfigError: a member without a resumable slice (the older single-run loop's checkpoint,
            or weights only), members at different points, or a slice that does not fit this population
            (names the member's folder).
    """
    payloads = [m.payload for m in members]
    points = {resume_point(p) for p in payloads}
    if len(points) != 1 or None in points or CLASSIC in points:
        where = ", ".join(f"{m.run_dir} ({resume_point(m.payload)})" for m in members)
        raise ConfigError(f"resume: the members of one population must continue from resumable population "
                          f"checkpoints of the same env step; got {where}")
    first = payloads[0]["member_state"]
    saved = {bool(p["member_state"]["replay_saved"]) for p in payloads}
    if len(saved) != 1 or any(int(p["member_state"]["updates"]) != int(first["updates"]) for p in payloads):
        raise ConfigError("resume: the members' checkpoints disagree on the population's updates or replay; "
                          "they were not written at one boundary")
    replay_saved = saved.pop()
    for p, (m, payload) in enumerate(zip(members, payloads)):
        state = payload["member_state"]
        tensors = state["tensors"]
        for name in COUNTERS:  # a checkpoint written before the counters had their own names held the
            if name not in tensors:  # update counter as replay.priorities.updates (PER), lost without the replay
                tensors = {**tensors, name: torch.tensor(int(state[name]), dtype=torch.int64)}
        restore_member(s, p, tensors, replay_saved, str(m.run_dir / "checkpoints" / "last.pt"), best)
    return Restored(int(first["env_steps"]), int(first["updates"]), replay_saved,
                    [dict(p["member_state"]["loop"]) for p in payloads])
