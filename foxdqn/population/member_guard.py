"""The training guard of a population: per member, a bad update is skipped and the member halts.

Member p's update is bad when its loss or gradient norm is not finite (NaN/Inf) or its loss is
above ``guard.loss_clip`` (p's own value), or, with p's ``guard.max_weight``, when the weights
its Adam step would write are not finite or some |w| is above that bound (the post-step weight
check, :mod:`foxdqn.population.weight_check`; it fires only when no other flag fired on that
update), or, with p's ``guard.collapse_multiplier`` > 0, when after ``guard.warmup_updates``
updates its (pre-clip) gradient norm stayed below ``optim.lr × guard.collapse_multiplier`` (its
own) for more than ``guard.collapse_patience`` updates in a row (the collapse check), as for a
single run (docs/design/guard.md). Then p's
update is skipped (Adam, target and counters untouched, :class:`~foxdqn.population.optim.MemberAdam`
reads the returned flags) and p is halted: from then on every update of p is skipped, so p keeps its last
good weights, while the other members train on unchanged. Each iteration ends with one kernel that
stores the halt state into pinned host memory (:mod:`foxdqn.ops.member_publish`), which the host
reads without waiting (docs/design/hot_loop.md#the-contract).

Each update also writes each member's Q-monitor divergence flag (:meth:`MemberGuard.check`, in
the guard's kernel: the batch's online Q has a non-finite entry or some |Q| above the member's
``guard.q_divergence``), not latched;
:meth:`MemberGuard.publish` copies the flag of the iteration's last update to
:attr:`MemberGuard.q_host`, which the host reads after each iteration
(foxdqn.population.train): the member halts (:meth:`MemberGuard.halt_q`), or with
``early_stop.on_q_divergence`` stops.

The host freezes a member the same way when early stopping ends it (:meth:`MemberGuard.stop`,
codes :data:`EARLY_STOP_VAL` / :data:`EARLY_STOP_Q`, foxdqn.run.early_stop's reasons) or a search's
median pruner does (:data:`PRUNED`, foxdqn.run.search): its updates are skipped from then on, but
it is a normal end, not a halt (:meth:`MemberGuard.reason` is None).
"""
from __future__ import annotations

import torch

from foxdqn.ops.member_guard import LOSS_CLIP, NON_FINITE, member_guard
from foxdqn.ops.member_publish import member_publish

#: halt codes (``MemberGuard.code``): why a member halted.
OK = 0
#: stop codes (``MemberGuard.code``): the member was frozen by the host (not a halt): by early
#: stopping, or by the search's median pruner (``search.pruner=median``).
EARLY_STOP_VAL, EARLY_STOP_Q = 3, 4
#: halt codes of the checks applied after the kernel's (:meth:`MemberGuard.check`)
MAX_WEIGHT, COLLAPSE = 5, 6
PRUNED = 7
#: halt code set by the host (:meth:`MemberGuard.halt_q`): the Q monitor's divergence flag, as a single run halts on it
Q_DIVERGENCE = 8
STOPS = {"early_stop_val": EARLY_STOP_VAL, "early_stop_q": EARLY_STOP_Q, "pruned": PRUNED}
REASONS = {NON_FINITE: "non-finite loss or gradient norm (NaN/Inf)", LOSS_CLIP: "loss above guard.loss_clip",
           MAX_WEIGHT: "weights non-finite or above guard.max_weight after the step",
           COLLAPSE: "gradient collapse (norm below optim.lr x guard.collapse_multiplier for more than "
                     "guard.collapse_patience updates)",
           Q_DIVERGENCE: "Q monitor: q_divergence (a Q value non-finite or above guard.q_divergence)"}


class MemberGuard:
    """Per-member skip flags and halt latch.

    Args:
        loss_clip: float32 ``[P]``, each member's ``guard.loss_clip``.
        device: where the flags live.
        max_weight: None (no member checks its weights), or float32 ``[P]``, each member's
            ``guard.max_weight`` (0: that member's check is off).
        collapse: None (no member checks for a gradient collapse), or (threshold float32 ``[P]``,
            each member's ``optim.lr × guard.collapse_multiplier`` rounded once from float64 as a
            single run's, 0: off; warm-up int64 ``[P]``, ``guard.warmup_updates``; patience int64
            ``[P]``, ``guard.collapse_patience``).

    Attributes:
        halted: float32 ``[P]``, 1 once a member halted: the skip flags of every update from then on
        (read by Adam and the target update).  code: int64 ``[P]``, the first halt's
        code (:data:`REASONS`).  at_update: int64 ``[P]``, the update that halted it (−1: none).
        host: pinned (on CUDA) int64 ``[4, P]`` copy of (halted, code, at_update, at_env_steps), refreshed by
        :meth:`publish` without a wait.  at_env_steps: int64 ``[P]``, the member's env steps when it
        halted (−1: none).  q_divergence: None, or float32 ``[P]`` (each member's
        ``guard.q_divergence``): then q_diverged (float32 ``[P]``, the last :meth:`check`'s flags)
        and q_host (its pinned int64 ``[P]`` copy, refreshed by :meth:`publish`).
    """

    def __init__(self, loss_clip: torch.Tensor, device: torch.device, max_weight: torch.Tensor | None = None,
                 collapse: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                 q_divergence: torch.Tensor | None = None):
        p = loss_clip.shape[0]
        self.loss_clip = loss_clip
        self.max_weight = max_weight
        self.collapse = collapse
        self.collapse_count = torch.zeros(p, dtype=torch.int64, device=device)  # collapsed updates in a row
        self.halted = torch.zeros(p, device=device)
        self.code = torch.zeros(p, dtype=torch.int64, device=device)
        self.at_update = torch.full((p,), -1, dtype=torch.int64, device=device)
        self.at_env_steps = torch.full((p,), -1, dtype=torch.int64, device=device)
        self.host = torch.zeros(4, p, dtype=torch.int64, pin_memory=device.type == "cuda")
        self.q_divergence = q_divergence
        if q_divergence is not None:
            self.q_diverged = torch.zeros(p, device=device)
            self.q_host = torch.zeros(p, dtype=torch.int64, pin_memory=device.type == "cuda")

    def check(self, loss: torch.Tensor, grad_norm: torch.Tensor, updates: torch.Tensor,
              env_steps: torch.Tensor, stats: torch.Tensor | None = None,
              q: torch.Tensor | None = None, weight_max: torch.Tensor | None = None) -> torch.Tensor:
        """The skip flags (:attr:`halted`, float32 ``[P]``) after this update's ``loss`` and ``grad_norm`` (float32 ``[P]``);
        ``updates`` (int64 0-d) is the update's number, ``env_steps`` (int64 0-d) each member's
        env steps so far. With ``stats`` (float64 ``[P, 5]``, :meth:`foxdqn.population.stats.MemberStats.update_columns`)
        and ``q`` (float32 ``[P, B, A]``, the batch's online Q) the update's monitor sums are added
        in the same launch: :func:`foxdqn.ops.member_guard.member_guard`, one kernel on CUDA.

        ``weight_max``: with :attr:`max_weight`, float32 ``[P]``, each member's largest |w| after
        the step (:meth:`foxdqn.population.weight_check.MemberWeightCheck.run`): a member whose
        check is on and whose value is not <= its bound halts with :data:`MAX_WEIGHT`, unless the
        kernel's flags fired on this update or it had halted before (the single run's
        ``halt_weight``); its skip is counted in ``stats`` as the kernel counts the others'.

        With :attr:`collapse`, the single run's collapse rule per member (before the weight check,
        which it suppresses as the single run's does): ``collapsed = updates >= warmup and
        grad_norm < threshold``, the count of collapsed updates in a row advances (or resets to 0),
        and a member whose count exceeds its patience halts with :data:`COLLAPSE` (the kernel's
        NaN/Inf or loss-clip code when one fired on the same update)."""
        qdiv = self.q_divergence is not None and q is not None  # the Q monitor's flags in the same launch
        member_guard(loss, grad_norm, self.loss_clip, self.halted, self.code, self.at_update,
                     self.at_env_steps, updates, env_steps, stats=stats, q=q,
                     q_threshold=self.q_divergence if qdiv else None, q_diverged=self.q_diverged if qdiv else None)
        if self.collapse is not None:
            threshold, warmup, patience = self.collapse
            collapsed = (updates >= warmup) & (grad_norm < threshold)  # IEEE: a NaN norm never collapses
            self.collapse_count.copy_(torch.where(collapsed, self.collapse_count + 1, 0))
            self._flag(collapsed & (self.collapse_count > patience), COLLAPSE, updates, env_steps, stats)
        if weight_max is not None:
            self._flag(~(weight_max <= self.max_weight) & (self.max_weight > 0), MAX_WEIGHT, updates, env_steps, stats)
        return self.halted

    def _flag(self, bad: torch.Tensor, code: int, updates: torch.Tensor, env_steps: torch.Tensor,
              stats: torch.Tensor | None) -> None:
        """Halt the members where ``bad`` (bool ``[P]``) that are not halted yet with ``code``, at
        this update (device ops only); their skip joins ``stats``' skipped column."""
        first = bad & (self.halted == 0)
        self.code.copy_(torch.where(first, code, self.code))
        self.at_update.copy_(torch.where(first, updates, self.at_update))
        self.at_env_steps.copy_(torch.where(first, env_steps, self.at_env_steps))
        flag = first.to(torch.float32)
        self.halted.copy_(torch.maximum(self.halted, flag))
        if stats is not None:
            stats[:, 3] += flag.to(torch.float64)

    def publish(self) -> None:
        """Store (halted, code, at_update, at_env_steps) into :attr:`host` (and the Q divergence flags
        into :attr:`q_host`) without a wait: one kernel on CUDA (:mod:`foxdqn.ops.member_publish`)."""
        qdiv = self.q_divergence is not None
        member_publish(self.halted, self.code, self.at_update, self.at_env_steps, self.host,
                       q_diverged=self.q_diverged if qdiv else None, q_host=self.q_host if qdiv else None)

    def q_diverged_now(self, p: int) -> bool:
        """Member ``p``'s Q divergence flag of the last published update (host copy; False without
        the check)."""
        return self.q_divergence is not None and bool(self.q_host[p])

    def stop(self, p: int, reason: str, updates: int, env_steps: int) -> None:
        """Freeze member ``p`` from the host between iterations (early stopping's or the pruner's
        ``reason``, a key of :data:`STOPS`): every later update of ``p`` is skipped, as after a halt, and
        :meth:`halt_point` gives (``env_steps``, ``updates``), the counts of its weights now. Writes
        the device state and the host copy (call after a device sync: the log or eval boundary's).

        Raises:
            ValueError: ``reason`` not in :data:`STOPS`, or ``p`` already frozen.
        """
        if reason not in STOPS:
            raise ValueError(f"reason must be one of {tuple(STOPS)}, got {reason!r}")
        if int(self.host[0, p]):
            raise ValueError(f"member {p} is already frozen")
        values = (1, STOPS[reason], int(updates), int(env_steps))
        for tensor, value in zip((self.halted, self.code, self.at_update, self.at_env_steps), values):
            tensor[p] = value
        self.host[:, p] = torch.tensor(values, dtype=torch.int64)

    def halt_q(self, p: int, updates: int, env_steps: int) -> None:
        """Halt member ``p`` from the host between iterations because its last update's Q diverged
        (:meth:`check`'s published flag; code :data:`Q_DIVERGENCE`): its later updates are skipped,
        and :meth:`halt_point` gives (``env_steps``, ``updates``), the counts of its weights now (the
        flagged update, ``updates`` − 1, was applied). Call after a device sync, as :meth:`stop`."""
        values = (1, Q_DIVERGENCE, int(updates), int(env_steps))
        for tensor, value in zip((self.halted, self.code, self.at_update, self.at_env_steps), values):
            tensor[p] = value
        self.host[:, p] = torch.tensor(values, dtype=torch.int64)

    def reason(self, p: int) -> str | None:
        """Member ``p``'s halt reason from the host copy (None: not halted, or stopped by
        :meth:`stop`, a normal end); call after a device sync for an exact answer, any time for
        the newest published one."""
        halted, code, at = self.host_column(p)[:3]
        if not halted or code in STOPS.values():
            return None
        return f"{REASONS.get(code, 'unknown')} at update {at - 1 if code == Q_DIVERGENCE else at}"

    def gauges(self, p: int, updates: int, collapse_count: float = 0.0) -> dict[str, float]:
        """Member ``p``'s guard state for its Prometheus gauges
        (:meth:`foxdqn.logger.prometheus_log.PrometheusExporter.guard`), from the host copies only
        (call after the log boundary's device sync): the flags ``halt_nan``, ``halt_loss_clip``,
        ``halt_grad_collapse``, ``halt_weight`` (its halt's code), ``q_divergence`` (a halt on it, or
        the last published update's flag), ``skip`` (frozen: halted or stopped), ``halted`` (a guard
        halt, :meth:`reason`), each 0.0 or 1.0; ``step`` (its newest update number: ``updates`` − 1
        while it runs, the update that halted it, or its last applied one when stopped or halted
        by the Q monitor), ``collapse_count`` (as given: the host copy of
        :attr:`collapse_count` made with the accumulators'), ``halt_updates`` and ``halt_env_steps``
        (:meth:`halt_point`'s, −1 while it runs). ``updates``: the population's update count."""
        frozen, code, at, steps = self.host_column(p)
        halted = bool(frozen) and code not in STOPS.values()
        flags = {name: float(halted and code == c) for name, c in
                 (("halt_nan", NON_FINITE), ("halt_loss_clip", LOSS_CLIP), ("halt_grad_collapse", COLLAPSE),
                  ("halt_weight", MAX_WEIGHT))}
        flags["q_divergence"] = float((halted and code == Q_DIVERGENCE) or self.q_diverged_now(p))
        if not frozen:
            step = updates - 1
        else:  # the kernel's halts count the update that fired; a stop or a Q halt, the updates applied
            step = at - 1 if code in (*STOPS.values(), Q_DIVERGENCE) else at
        return {**flags, "skip": float(frozen), "halted": float(halted), "step": float(step),
                "collapse_count": float(collapse_count), "halt_updates": float(at if frozen else -1),
                "halt_env_steps": float(steps if frozen else -1)}

    def halt_point(self, p: int) -> tuple[int, int] | None:
        """(env steps, updates applied) of member ``p`` when it halted or was stopped, from the host
        copy; None: neither. The update that halted it was not applied."""
        halted, _, at, steps = self.host_column(p)
        return (steps, at) if halted else None

    def host_column(self, p: int) -> list[int]:
        """Member ``p``'s column of the host copy (halted, code, at update, at env steps) as ints
        (through numpy: a loop over a tensor's entries costs a tensor per entry)."""
        return self.host.numpy()[:, p].tolist()
