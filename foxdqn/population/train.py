"""Train a population: P jobs of a sweep in one process and one captured iteration.

:func:`train_population` is what ``hydra/launcher=population`` calls for a group of jobs that
share a :func:`~foxdqn.population.grouping.group_key` (docs/usage.md). Per iteration: one CUDA-graph
replay for all members (eager on CPU) and a read of the guard's pinned host copy (no wait). Per log
interval: one device→host copy of every member's accumulators, one metrics row per member into its
own run folder, and to its MLflow and W&B runs (``logger.mlflow``, ``logger.wandb``: one each, as a
single run's, :class:`foxdqn.run.trackers.Trackers`) and the population's one Prometheus endpoint
(``logger.prometheus.port``: a series per member, labelled ``member``, ``job`` and ``seed``). At the
end, per member: ``checkpoints/last.pt`` (its weights), then the same selection, evaluation and report
as a single run (:func:`foxdqn.run.finish.finish`) into its own folder, and its final metrics to its
MLflow and W&B runs. A member halted by the guard gets ``HALTED`` and its last good weights (its MLflow
run ``FAILED``, its W&B run exit code 1); the others finish.

With ``eval.interval_env_steps`` > 0 every member is validated at each eval boundary, all at once
(foxdqn.population.evaluate), and each gets its ``val/*`` row; with ``early_stop.enabled`` each
member's best weights are kept (foxdqn.population.selection), a member whose validation plateaus
(or whose mean max-Q stays above ``early_stop.q_bound``, or, with ``early_stop.on_q_divergence``,
whose last update of an iteration has the Q monitor's divergence flag) is frozen by the guard's mechanism
(:meth:`~foxdqn.population.member_guard.MemberGuard.stop`) while the others train on, and the
loop ends when every member has stopped or halted. At the end such a member is evaluated with its
best weights (``checkpoints/best.pt``), as a single run is. With ``search.pruner=median`` each member
has its own median pruner (:func:`foxdqn.run.search.member_pruner`: its job number, the sweep
folder), fed its validation values as a single run's; a member below the median of the sweep's
finished jobs is frozen the same way (reason ``pruned``) and reported as a pruned single run.
"""
from __future__ import annotations

import copy
import functools
import logging
from collections import deque
import math
import signal
import time
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np
import torch

from foxdqn.config.schema import to_plain
from foxdqn.run.finish import Agent, RunEnd, finish
from foxdqn.io_atomic import deferred_sync, write_text_atomic
from foxdqn.population import step as P
from foxdqn.analysis.backtest import POLICIES
from foxdqn.population.checkpoint import HostCopy, member_checkpoint, member_counts, member_payload
from foxdqn.population.checkpoint_batch import member_files, write_member_files
from foxdqn.population.writer import BackgroundWriter
from foxdqn.run.checkpoint import write_payload
from foxdqn.population.diversity import MemberDiversity
from foxdqn.population.jobs import FINISHED, HALTED, Member, Outcome
from foxdqn.population.selection import MemberSelection
from foxdqn.population.state import build_population
from foxdqn.population.stats import FIELDS, MemberStats
from foxdqn.run.trackers import Trackers, open_prometheus
from foxdqn.step.iteration import make_iteration
from foxdqn.timings import mark

log = logging.getLogger(__name__)


def use_graph(cfg, device: torch.device) -> bool:
    """Whether the iterations are captured in a CUDA graph: ``graph=on`` (CUDA only), or
    ``graph=auto`` on CUDA.

    Raises:
        ConfigError: ``graph=on`` on a device that is not CUDA.
    """
    from foxdqn.errors import ConfigError

    if cfg.graph == "on" and device.type != "cuda":
        raise ConfigError("graph=on needs a CUDA device; use graph=auto or graph=off on CPU")
    return cfg.graph == "on" or (cfg.graph == "auto" and device.type == "cuda")


#: Host seconds per iteration, on average, given to writing the last log boundary's rows
#: (:meth:`_Population._write_rows`): about half of a 512-member cartpole_cleanrl iteration on the
#: H200, so the host keeps ahead of the device while a row takes longer than that (0.2-0.5 ms with
#: TensorBoard: one row every few iterations).
DEFERRED_ROWS_S = 2e-4

class IterationPlan(NamedTuple):
    """The iteration counts of a run, from its config: ``per_iter`` env steps of one member's N
    envs per iteration (N·T), ``total_iters`` iterations (at least 1), the first ``warm_iters`` of
    them collect-only (``agent.learning_starts``), a log row every ``log_every`` iterations."""

    per_iter: int
    total_iters: int
    warm_iters: int
    log_every: int

    @classmethod
    def of(cls, cfg) -> "IterationPlan":
        a = cfg.agent
        per_iter = cfg.env.num_envs * a.steps_per_iter
        total = max(1, math.ceil(a.total_env_steps / per_iter))
        return cls(per_iter, total, min(total, math.ceil(a.learning_starts / per_iter)),
                   max(1, cfg.log.interval_env_steps // per_iter))


class StopSignals:
    """While active, SIGINT and SIGTERM set :attr:`received` (the loop stops after its iteration and
    writes the checkpoints) instead of killing the process; more signals while it stops are
    ignored, so a checkpoint is never cut short. The previous handlers come back on exit. Outside
    the main thread (where no handler can be set) it does nothing."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._old: dict = {}

    def _handle(self, signum, frame) -> None:
        self.received = self.received or signum

    def __enter__(self) -> "StopSignals":
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


class _Population:
    """One call of :func:`train_population`: setup, the iteration loop, the end per member."""

    def __init__(self, members: list[Member], alone: bool = False) -> None:
        from foxdqn.run.early_stop import resolve_metric
        from foxdqn.run.search import member_pruner
        from foxdqn.step.build import resolve_device

        self.t0 = time.perf_counter()
        self.members = members
        self.alone = alone  # a single run (foxdqn.job.run.run_job): its outputs and lines are a single run's
        self.gates: list[dict] = []  # each member's deployment-gate summary entry (eval.gate.enabled)
        cfg = members[0].tc
        self.device = resolve_device(cfg.device)
        self.graph = use_graph(cfg, self.device)
        self.s = s = build_population([m.tc for m in members], members[0].market, self.device)
        a = cfg.agent
        # env steps of one member per iteration, iterations, collect-only ones, log interval
        self.per_iter, self.total_iters, self.warm_iters, self.log_every = IterationPlan.of(cfg)
        step_fns = P.iteration_steps(s)  # with the collect steps beside the update where they may run so
        # env=gym: host envs, eager collect steps and a captured update-only graph (HostEnvIteration)
        self.collect_only = make_iteration(s, self.graph, updates=0, on_host=s.env.on_host, **step_fns)
        self.full = make_iteration(s, self.graph, on_host=s.env.on_host, **step_fns)
        self.loggers: list = []  # foxdqn.logger.MetricsLogger per member, opened after the run folders (open_loggers)
        self.trackers: list[Trackers] = []  # each member's MLflow and W&B runs (open_loggers)
        self.prometheus_rows: list = []  # each member's rows and guard gauges of the endpoint (open_loggers)
        # the population's one endpoint, or None; a port taken since the preflight: bad input, before any folder
        self.prometheus = open_prometheus(cfg)
        self.env_steps, self.host_updates = 0, 0
        self.stopped: set[int] = set()  # members halted at an earlier log boundary or early-stopped: no more rows
        self.eval_every = max(1, cfg.eval.interval_env_steps // self.per_iter) if cfg.eval.interval_env_steps else 0
        self.selection = MemberSelection(s)
        self.diversity = MemberDiversity(s.cfgs, cfg.env.name == "trading",
                                         None if alone else [m.job_num for m in members])
        self.recent_return = float("nan")  # a single run's progress line: the last interval's mean return
        self._plain: dict[int, dict] = {}  # plain_config's conversions
        self.writer = BackgroundWriter()  # the periodic checkpoints
        self.pinned: dict[str, torch.Tensor] = {}  # their host buffers on CUDA, reused (HostCopy)
        self.pending_rows: deque = deque()  # what _write_rows does next: write a row, or a task after rows
        self.row_credit = 0.0  # host seconds _write_rows may still spend on pending rows (its budget's sum)
        self.plots: list = []  # the members' report plots, drawn once every summary is written
        # search.pruner=median: each member's own pruner (its job number, the sweep folder), else Nones
        self.trial_pruners = [member_pruner(m) for m in members]
        self.trial_metric = resolve_metric(cfg.early_stop.metric, cfg.env.name)  # a group key
        self.pruned_at: list[int | None] = [None] * len(members)  # env steps where the pruner stopped a member
        self.run_ids: list[str | None] = [m.run_id for m in members]  # each member's run id (set by train_population)
        self.start_iter, self.wall_before, self.resumed_at = 0, 0.0, None
        self.closed = False  # close() has run once
        self.loop_timed = False  # close() has ended the training phase (foxdqn.timings)
        if any(m.payload is not None for m in members):
            try:
                self._restore()
            except BaseException:  # a checkpoint that does not fit: the endpoint opened above is closed again
                if self.prometheus is not None:
                    self.prometheus.close()
                raise
        mark("build")  # foxdqn.timings, as a single run's phases; warm-up and capture are marked by the iterations
        sizes = (self.total_iters * self.per_iter, self.total_iters, cfg.env.num_envs, a.steps_per_iter,
                 a.updates_per_iter)
        if alone:  # a single run's line
            market = members[0].market
            log.info("%s: %s on %s (graph=%s), %d env steps in %d iterations of %d envs x %d steps, %d updates each",
                     cfg.experiment, cfg.env.name if market is None else market.source, self.device, self.graph,
                     *sizes)
        else:
            log.info("population of %d members (jobs %s): %s on %s (graph=%s), %d env steps each in %d iterations "
                     "of %d envs x %d steps, %d updates each", len(members),
                     ", ".join(str(m.job_num) for m in members), cfg.experiment, self.device, self.graph, *sizes)

    def _restore(self) -> None:
        """Continue every member from its checkpoint (:func:`foxdqn.population.resume.restore_members`):
        device state, counters, each member's early stopper, kept best weights and pruner stop; a
        member frozen before (halted, early-stopped, pruned) stays frozen. Without the replay in the
        checkpoints, ``agent.learning_starts`` transitions are collected first, as a single run does."""
        import math

        from foxdqn.population.resume import restore_members

        point = restore_members(self.s, self.members, self.selection.best)
        self.start_iter = point.env_steps // self.per_iter
        self.env_steps, self.host_updates, self.resumed_at = point.env_steps, point.updates, point.env_steps
        for p, loop in enumerate(point.loops):
            stopper = self.selection.stoppers[p]
            if stopper is not None and loop.get("stopper") is not None:
                stopper.load_state_dict(loop["stopper"])
            counts = loop.get("best_counts")
            self.selection.best_counts[p] = None if counts is None else (int(counts[0]), int(counts[1]))
            self.pruned_at[p] = loop.get("pruned_at")
            if loop.get("collapse") is not None:
                self.diversity.collapse[p].load_state_dict(loop["collapse"])
            self.recent_return = float(loop.get("recent_return", float("nan")))
        self.wall_before = max(float(loop.get("wall_before", 0.0)) for loop in point.loops)
        self.stopped = {p for p in range(len(self.members)) if int(self.s.guard.host[0, p])}
        log.info("resuming %sat %d env steps (iteration %d of %d)", "" if self.alone else f"{len(self.members)} members ",
                 point.env_steps, self.start_iter, self.total_iters)
        if not point.replay_saved:  # an empty replay: collect agent.learning_starts transitions first
            refill = math.ceil(self.members[0].tc.agent.learning_starts / self.per_iter)
            self.warm_iters = max(self.warm_iters, min(self.total_iters, self.start_iter + refill))
            log.warning("the checkpoints hold no replay (checkpoint.save_replay=false): %d collect-only iterations "
                        "refill it before updates continue; the run is not an exact continuation", refill)

    def wall(self) -> float:
        """Training wall time in seconds, over all runs of this training (resumes included)."""
        return self.wall_before + time.perf_counter() - self.t0

    def loop_state(self, p: int) -> dict:
        """Member ``p``'s host loop state, plain data, saved in its resumable checkpoint."""
        stopper, counts = self.selection.stoppers[p], self.selection.best_counts[p]
        return {"stopper": None if stopper is None else stopper.state_dict(),
                "collapse": self.diversity.collapse[p].state_dict(), "recent_return": self.recent_return,
                "best_counts": None if counts is None else list(counts), "pruned_at": self.pruned_at[p],
                "wall_before": self.wall()}

    def save(self, background: bool = False, periodic: bool = False) -> list[Path]:
        """Every member's resumable ``checkpoints/last.pt`` (:func:`member_payload` with its loop
        state), from one read of the device (:class:`HostCopy`), one file-system sync for all;
        returns their paths. The files are encoded together (:func:`member_files`: every member's
        tensors packed at once), or with ``checkpoint.save_replay`` member by member, as each
        member's replay is read from the device. The batch in flight is waited for first: on CUDA
        the host copy reuses its page-locked buffers (:attr:`pinned`). ``background``: the host
        copy, the loop states and the counts are taken now; :attr:`writer` encodes the files from
        them (the networks' host twins, never the networks; the payloads with the replay are built
        here) and writes them while training goes on. Else these are written before returning.
        A boundary's rows are on disk before its checkpoint: they are written first, or with
        ``periodic`` (a checkpoint of the loop, always in the background; without the replay) by the loop
        while the device runs, and the batch is handed to the writer after them, with the collapse
        monitors' states their rows left (:meth:`_member_row` updates them).

        Raises:
            OSError: a checkpoint (of this batch, or of the one in flight) could not be written.
        """
        s, best = self.s, self.selection.best
        background = background or periodic
        replay = any(cfg.checkpoint.save_replay for cfg in s.cfgs)
        after_rows = periodic and not replay and bool(self.pending_rows)
        if not after_rows:
            self._write_rows()  # a boundary's rows are on disk before its checkpoint
        self.writer.wait()  # the batch in flight no longer reads the host buffers this copy reuses
        host = HostCopy(s, best, self.pinned)
        for net in (s.online, s.target, s.value):
            host.twin(net)  # here: the writer's thread never touches the live networks
        paths = [m.run_dir / "checkpoints" / "last.pt" for m in self.members]
        members = [dict(run_id=self.run_ids[p], loop=copy.deepcopy(self.loop_state(p)), config=self.plain_config(p),
                        counts=s.guard.halt_point(p) or (host.env_steps, host.updates))
                   for p in range(len(self.members))]

        def payloads() -> list[tuple[Path, dict]]:  # the replay is read from the device, member by member
            return [(path, member_payload(s, p, best=best, host=host, **kw))
                    for p, (path, kw) in enumerate(zip(paths, members))]

        def files() -> Iterator[tuple[Path, bytes]]:  # every member's tensors packed at once
            return ((paths[p], data) for p, data in member_files(s, host, members))

        def submit_after_rows() -> None:  # the loop's task after this boundary's rows
            for p, kw in enumerate(members):
                kw["loop"]["collapse"] = self.diversity.collapse[p].state_dict()
            self.writer.submit(files)

        if after_rows:
            self.pending_rows.append(submit_after_rows)
        elif background:
            self.writer.submit(payloads() if replay else files)
        if background:
            return paths
        with deferred_sync():
            if replay:
                return [write_payload(path, payload) for path, payload in payloads()]
            return write_member_files(s, host, paths, members)

    def plain_config(self, p: int) -> dict:
        """Member ``p``'s config as plain data (converted once, for all its checkpoints)."""
        if p not in self._plain:
            self._plain[p] = to_plain(self.s.cfgs[p])
        return self._plain[p]

    def _checkpoint_due(self, it: int, last: bool) -> bool:
        """A log boundary past a multiple of ``checkpoint.every_env_steps`` (not the last iteration),
        a single run's rule too."""
        every = self.members[0].tc.checkpoint.every_env_steps
        return bool(every) and not last and (it + 1) % self.log_every == 0 and \
            self.env_steps // every > (self.env_steps - self.log_every * self.per_iter) // every

    def open_loggers(self) -> None:
        """Each member's metrics logger (metrics.csv, tb/) in its run folder, with its MLflow and
        W&B runs and its rows of the population's Prometheus endpoint as sinks; a resumed member's
        rows after its checkpoint are dropped first."""
        from foxdqn.logger import MetricsLogger

        for p, m in enumerate(self.members):
            self.trackers.append(Trackers(m.tc, m.run_dir, None, job=None) if self.alone else
                                 Trackers(m.tc, m.run_dir, m.overrides, job=m.job_num))
            sinks = list(self.trackers[p].sinks)
            if self.prometheus is not None:
                self.prometheus_rows.append(self.prometheus.rows({"member": p, "job": m.job_num, "seed": m.tc.seed}))
                sinks.append(self.prometheus_rows[p])
            self.loggers.append(MetricsLogger(m.run_dir, tensorboard=m.tc.logger.tensorboard, sinks=sinks,
                                              resume_after=self.resumed_at))

    def iterate(self, signals) -> None:
        from foxdqn.logger.progress import TrainProgress

        cfg = self.members[0].tc
        t_log, steps_log = time.perf_counter(), self.env_steps
        with TrainProgress(total=self.total_iters * self.per_iter, enabled=cfg.log.progress,
                           initial=self.start_iter * self.per_iter) as progress:
            for it in range(self.start_iter, self.total_iters):
                (self.collect_only if it < self.warm_iters else self.full)()
                self._write_rows(DEFERRED_ROWS_S)  # the last boundary's rows, while the device runs
                self.host_updates += 0 if it < self.warm_iters else cfg.agent.updates_per_iter
                self.env_steps = (it + 1) * self.per_iter
                last = it == self.total_iters - 1
                self._halted_since()
                if self.s.guard.q_divergence is not None and it >= self.warm_iters:
                    self._q_divergence()
                if (it + 1) % self.log_every == 0 or last:
                    now = time.perf_counter()
                    rate = (self.env_steps - steps_log) / max(now - t_log, 1e-9)
                    t_log, steps_log = now, self.env_steps
                    returns = self._log_rows(rate, last)
                    progress.update(self.env_steps, self._progress_fields(returns))
                # with early stopping the final weights are validated too (they compete for "best")
                if self.eval_every and (((it + 1) % self.eval_every == 0 and not last) or
                                        (self.selection.enabled and last)):
                    self._validate(it, last)
                if self.s.guard.host.numpy()[0].all():  # every member halted or stopped: nothing left to train
                    break
                if signals.received is not None and not last:
                    break
                if self._checkpoint_due(it, last):
                    mark("training")
                    self.save(periodic=True)  # written while the next iterations run
                    mark("periodic_checkpoint")

    def _log_rows(self, rate: float, last: bool) -> list[float]:
        """One row per member that has not halted or stopped (:meth:`_halted_since`; on CUDA a halt the
        host copy did not show yet gets its row, with the halt's update count), from one host copy of
        the accumulators (the interval's one sync); returns the members' episode returns. With
        ``early_stop.q_bound``, a member whose mean max-Q stayed high is stopped (``early_stop_q``)
        here; the rows themselves are built when :meth:`_write_rows` writes them (:meth:`_member_row`),
        so the device waits only for the read and these decisions."""
        s = self.s
        self._write_rows()
        extra = [] if s.pruner is None else [s.pruner.log_values(s.updates)]  # [P, 2]: measured, scheduled
        if self.prometheus is not None:  # the guard's collapse counts, in the same copy
            extra.append(s.guard.collapse_count.unsqueeze(1).to(torch.float64))
        acc, counts = s.stats.read(torch.cat(extra, dim=1) if extra else None)  # waits for the device
        if self.prometheus is not None:  # every member's guard gauges, halted ones too (the host copy is current)
            for p, rows in enumerate(self.prometheus_rows):
                rows.guard(s.guard.gauges(p, self.host_updates, acc[p][-1]))
        if self.alone:  # the progress line's fields (a stopped member's row without its ε)
            self.rows = [MemberStats.row(acc[0], self.diversity.columns(counts[0]))]
        for p, logger in enumerate(self.loggers):
            if p in self.stopped:
                continue
            halt = s.guard.halt_point(p)
            updates = self.host_updates if halt is None else halt[1]
            make_row = functools.partial(self._member_row, p, acc[p], counts[p], self.env_steps, rate, updates)
            if self.alone:  # one member: its row now, for the progress line
                self.rows[0] = make_row()
                make_row = functools.partial(dict, self.rows[0])
            self.pending_rows.append(functools.partial(self._write_row, logger, self.env_steps, make_row))
            stopper = self.selection.stoppers[p]
            if halt is not None:
                self.stopped.add(p)
            elif stopper is not None and stopper.update_q(q := MemberStats.mean_max_q(acc[p])) and not last:
                self._stop(p, "early_stop_q", stopper.q_detail(q))
        return [MemberStats.episode_return(a) for a in acc]

    def _member_row(self, p: int, acc: np.ndarray, counts: np.ndarray, env_steps: int, rate: float,
                    updates: int) -> dict:
        """Member ``p``'s row of the boundary at ``env_steps`` (names without ``train/``) from its
        accumulator row and action counts, and with ``diversity.enabled`` its log-file line and its
        collapse monitor's update: host work alone, done when :meth:`_write_rows` writes the row,
        while the device runs."""
        row = MemberStats.row(acc, self.diversity.columns(counts))
        if self.s.pruner is not None:  # prune.enabled: the member's sparsity reached and scheduled, as a single run's
            row["prune_sparsity"], row["prune_target_sparsity"] = acc[FIELDS:FIELDS + 2]
        tc = self.members[p].tc
        x = tc.explore  # ε of the next collect step, as the device computes it (hparams.MemberParams)
        frac = min(env_steps / max(x.eps_decay_fraction * tc.agent.total_env_steps, 1.0), 1.0)
        row.update(env_steps_per_s=rate, epsilon=x.eps_start + (x.eps_end - x.eps_start) * frac, updates=updates)
        self.diversity.observe(p, row, counts, env_steps)
        return row

    @staticmethod
    def _write_row(logger, env_steps: int, make_row) -> None:
        """Log the row ``make_row()`` builds (names without ``train/``) at ``env_steps``."""
        logger.log(env_steps, {f"train/{k}": v for k, v in make_row().items()})

    def _write_rows(self, budget_s: float | None = None) -> None:
        """Build and write the log rows :meth:`_log_rows` left (each member's metrics logger and its
        sinks), in order, and the tasks queued after them (a periodic checkpoint's hand-over to
        the writer, :meth:`save`): all of them, or with ``budget_s`` as many as this call's credit allows, so that a
        population's rows are written while the device runs the iterations after their boundary
        instead of keeping it idle (at 512 members, ~0.1 s a boundary on the H200 machine). Each
        call with ``budget_s`` adds ``budget_s`` to the credit and writes rows while it is
        positive, each row's time taken from it: on average the loop spends ``budget_s`` a call
        on rows, even where a row takes longer (then a row every few calls; a row per call would
        hold the host behind the device for the whole backlog). Every row is written before the
        next boundary reads the device, before a validation, a checkpoint's files or the end of
        the loop."""
        self.row_credit = math.inf if budget_s is None else self.row_credit + budget_s
        while self.pending_rows and self.row_credit > 0:
            start = time.perf_counter()
            self.pending_rows.popleft()()
            self.row_credit -= time.perf_counter() - start
        if not self.pending_rows:
            self.row_credit = 0.0  # no saving up while nothing waits: the next backlog starts from zero

    def _progress_fields(self, returns: list[float]) -> dict:
        """The progress line's fields: a single run's (ε, loss, the last interval's mean return, and
        the normalised action entropy with ``diversity.enabled``), or the members' count and mean return."""
        if not self.alone:
            return {"members": len(self.members), "ep_ret": float(torch.tensor(returns).nanmean())}
        row = self.rows[0]
        if row["episode_return"] == row["episode_return"]:  # not NaN: an episode ended in the interval
            self.recent_return = float(row["episode_return"])
        fields = {"eps": row.get("epsilon", float("nan")), "loss": row["loss"], "ep_ret": self.recent_return}
        if self.diversity.enabled:
            fields["H"] = row["action_entropy_norm"]
        return fields

    def _halted_since(self) -> None:
        """After an iteration: a member the guard halted (the published host copy, no wait) logs no
        more rows, from this iteration's boundary on. So a halted member's rows do not
        depend on when the other members halt (the loop ends early once every member has)."""
        guard = self.s.guard
        for p in np.flatnonzero(guard.host.numpy()[0]).tolist():  # halted or stopped (host copy; numpy: per iteration)
            if p not in self.stopped and guard.reason(p) is not None:
                self.stopped.add(p)

    def _q_divergence(self) -> None:
        """After an iteration: a running member whose last update's Q diverged (the guard's published
        flag, :meth:`MemberGuard.check`) and whose guard did not fire halts
        (:meth:`MemberGuard.halt_q`), or with ``early_stop.on_q_divergence`` stops as ``early_stop_q``;
        a member the guard halted stays halted."""
        guard, cfg = self.s.guard, self.members[0].tc
        for p in np.flatnonzero(guard.q_host.numpy()).tolist():  # the members whose last update diverged
            if p in self.stopped or guard.halt_point(p) is not None:
                continue
            if cfg.early_stop.enabled and cfg.early_stop.on_q_divergence:
                self._stop(p, "early_stop_q", f"Q monitor: q_divergence at update {self.host_updates - 1}")
                continue
            guard.halt_q(p, self.host_updates, self.env_steps)
            self.stopped.add(p)

    def _validate(self, it: int, last: bool) -> None:
        """The eval boundary: validate every member at once, log each running member's ``val/*`` row;
        with ``search.pruner=median`` stop it when its pruner says so (``pruned``: after the warm-up,
        not at the end); with early stopping keep its best weights and stop it after ``patience``
        evaluations without improvement."""
        from foxdqn.population.evaluate import member_validation

        s, env_steps = self.s, self.env_steps
        self._write_rows()  # the boundary's train/* rows before its val/* rows
        mark("training")
        vals = member_validation(s, self.members[0].market)  # waits for the device: the guard's host copy is current
        mark("validation")
        for p, metrics in enumerate(vals):
            if p in self.stopped or s.guard.halt_point(p) is not None:
                continue
            self.loggers[p].log(env_steps, {f"val/{k}": v for k, v in metrics.items()})
            pruner = self.trial_pruners[p]
            if pruner is not None and it >= self.warm_iters and not last and pruner.report(
                    env_steps, float(metrics.get(self.trial_metric, float("nan")))):
                self._stop(p, "pruned", "")  # below the sweep's median at this step
                continue
            stopper = self.selection.stoppers[p]
            if stopper is None or it < self.warm_iters:  # no update yet: the weights cannot improve
                continue
            if stopper.update_val(env_steps, metrics):
                self.selection.keep(s, p, env_steps, self.host_updates)
                log.info("job %d: best val %s = %.6g at %d env steps", self.members[p].job_num, stopper.metric,
                         stopper.best, env_steps, extra={"foxdqn_job": self.members[p].job_num, "foxdqn_detail": True})
            if stopper.val_exhausted and not last:
                self._stop(p, "early_stop_val", stopper.val_detail())

    def _stop(self, p: int, reason: str, detail: str) -> None:
        """End member ``p`` early: its stopper records it (``pruned``: :attr:`pruned_at`, whose
        pruner logged the single run's line), the guard freezes its weights from the next update
        on, and it logs no more rows."""
        job = self.members[p].job_num
        log.info("job %d stops early (%s): its weights are frozen from here", job, reason,
                 extra={"foxdqn_job": job, "foxdqn_detail": True})
        if reason == "pruned":
            self.pruned_at[p] = self.env_steps
        else:
            self.selection.stoppers[p].stop(reason, self.env_steps, detail)  # the single run's detail and log line
        self.s.guard.stop(p, reason, self.host_updates, self.env_steps)
        self.stopped.add(p)

    def close(self) -> None:
        """Wait for the device, close the members' Gymnasium envs (``env.name=gym``), every member's
        metrics logger and the Prometheus endpoint (idempotent)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        first = not self.closed
        if first:
            if not self.loop_timed:
                mark("training")  # the device has finished every iteration
                self.loop_timed = True
            self._write_rows()  # the last boundary's rows: host work after the loop (phase close)
            self.closed = True
        if self.s.env.on_host:  # env=gym: the members' vector env (its threads or processes)
            self.s.env.close()
        try:
            for logger in self.loggers:
                logger.close()
        finally:
            if self.prometheus is not None:
                self.prometheus.close()
            if first:
                mark("close")

    def end_trackers(self, outcomes: list[Outcome], signum: int | None) -> None:
        """End each member's MLflow and W&B runs as its single run would: its final metrics after
        its report (``outcomes[p]`` finished), FAILED / exit code 1 after a halt or an error,
        KILLED / 128 + ``signum`` after a signal."""
        for p, trackers in enumerate(self.trackers):
            if signum is not None:
                trackers.end("KILLED", 128 + signum)
            elif p < len(outcomes) and outcomes[p].exit_code == FINISHED:
                trackers.report(outcomes[p].summary, self.members[p].run_dir)
            else:
                trackers.end("FAILED", 1)

    def evaluate_members(self) -> tuple[list[dict], list[dict]]:
        """Every member's validation metrics and evaluation (``eval.split``), all members at once
        (foxdqn.population.evaluate). Trading: the values :func:`foxdqn.run.finish.finish` would
        compute for each (the walks are deterministic). Episodes (CartPole): the same number of
        greedy episodes, their resets drawn from the member's own generator (seed + offset), so
        ``python -m foxdqn.evaluate`` of the member's checkpoint (torch's generator) plays other
        episodes of the same distribution."""
        from foxdqn.analysis.gate import gate_enabled
        from foxdqn.population.evaluate import member_episodes, member_gated_walks, member_validation, member_walks

        s, cfg, market = self.s, self.s.cfg, self.members[0].market
        vals = member_validation(s, market)
        if gate_enabled(cfg):  # trading: the deployment gate (foxdqn.analysis.gate)
            tests, self.gates = member_gated_walks(s, market, cfg.eval.split, POLICIES)
            return vals, tests
        if cfg.env.name == "trading":
            return vals, member_walks(s, market, cfg.eval.split, POLICIES)
        return vals, member_episodes(s, cfg.eval.episodes, seed_offset=1)

    def keep_best(self) -> list[Path | None]:
        """With early stopping, each member's ``checkpoints/best.pt`` from its kept weights, which are
        then loaded into the population for its final evaluation (call after the members' ``last.pt``
        payloads are taken: :meth:`save` copies them to the host, so they keep the last weights);
        None for a member with nothing kept (evaluated with its last weights)."""
        sel, paths = self.selection, []
        host = HostCopy(self.s, sel.best) if sel.enabled and any(c is not None for c in sel.best_counts) else None
        for p, m in enumerate(self.members):
            counts = sel.best_counts[p]
            if not sel.enabled or counts is None:
                paths.append(None)
                continue
            paths.append(member_checkpoint(self.s, p, m.run_dir / "checkpoints" / "best.pt", sel.best, counts,
                                           host=host, config=self.plain_config(p), run_id=self.run_ids[p]))
            sel.restore(self.s, p)
        return paths

    def ensembles(self) -> dict[int, dict]:
        """The ``ensemble_policy`` summary entry of each member whose setting has two or more members
        (``eval.ensemble``, trading only: :func:`foxdqn.population.ensemble.ensemble_walks`)."""
        from foxdqn.population.ensemble import ensemble_walks

        cfg = self.s.cfg
        if cfg.env.name != "trading" or str(cfg.eval.ensemble) == "none":
            return {}
        return ensemble_walks(self.s, self.members[0].market, [m.job_num for m in self.members], str(cfg.eval.ensemble))

    def end_member(self, p: int, wall: float, ckpt: Path, val: dict, test: dict, ensemble: dict | None = None,
                   best: Path | None = None) -> Outcome:
        """HALTED (guard) for member ``p`` or its report from its validation metrics ``val``,
        evaluation ``test``, its setting's ``ensemble`` entry (None: none), its last checkpoint
        ``ckpt`` and its ``best`` checkpoint (early stopping; None: none); after the report its
        pruner's file says ``complete`` or ``pruned`` (a halted member's stays ``running``, as a
        halted single run's)."""
        s, m = self.s, self.members[p]
        reason = s.guard.reason(p)
        if reason is not None:
            write_text_atomic(m.run_dir / "HALTED", f"{reason}\n")
            return Outcome(None, HALTED, f"training halted: {reason}; last good weights saved to {ckpt}")
        extra = {} if self.alone else {
            "population": {"member": p, "size": s.members, "jobs": [mm.job_num for mm in self.members]}}
        extra.update(self.trackers[p].summary())
        if self.gates:
            extra["gate"] = self.gates[p]
        if ensemble:
            extra["ensemble_policy"] = ensemble
        end = RunEnd(self.graph, wall, *member_counts(s, p), ckpt, overrides=None if self.alone else list(m.overrides),
                     name="" if self.alone else f"job {m.job_num}: ", job=None if self.alone else m.job_num, extra=extra, val_metrics=val, test_result=test,
                     stopper=self.selection.stoppers[p], best_path=best, pruned_at=self.pruned_at[p],
                     collapse=self.diversity.collapse[p], plots=self.plots)
        agent = Agent(m.tc, None, s.action_mode, self.device)  # evaluated already: finish reads no network
        summary = finish(agent, m.market, m.run_dir, end)
        if self.trial_pruners[p] is not None:  # this member's validation values now count for the sweep's median
            self.trial_pruners[p].finish(pruned=self.pruned_at[p] is not None)
        return Outcome(summary, FINISHED, "")


def open_folders(members: list[Member]) -> list:
    """Each member's :class:`foxdqn.run.folder.RunFolder`, opened (locked, start record, ``INCOMPLETE``)
    as :func:`foxdqn.job.run.run_job` opens a single run's: a new run's folder must hold no run; a
    resumed member's must be its own; a member killed before its first checkpoint starts over in
    its folder (:func:`foxdqn.run.resume.start_over`). If one cannot be opened, those opened are
    released and the error is raised."""
    from foxdqn.run.folder import RECORD, RunFolder, previous_outputs

    folders = []
    try:
        with deferred_sync():  # P folders: one sync for all their records (foxdqn.io_atomic)
            for m in members:
                new = m.payload is None and m.run_id is None and (m.tc.resume is None or not previous_outputs(m.run_dir))
                # a resumed run keeps its start record as it started (a resume never rewrites it)
                record = m.tc if new or not (m.run_dir / RECORD).is_file() else None
                key = "hydra.run.dir" if m.sweep_dir is None else "hydra.sweep.dir or hydra.sweep.subdir"
                folders.append(RunFolder(m.run_dir, key).open(resume=not new, config=record, run_id=m.run_id))
                if not new and m.payload is None:  # killed before its first checkpoint: its partial outputs go
                    from foxdqn.run.resume import start_over

                    start_over(m.run_dir)
    except BaseException:
        for folder in folders:
            folder.release()
        raise
    return folders


def resume_hint(members: list[Member]) -> str:
    """How to continue an interrupted population of a multirun: its same command with ``resume=auto``
    and its sweep folder."""
    sweep = members[0].sweep_dir or members[0].run_dir.parent
    return f"continue with the same command and resume=auto hydra.sweep.dir={sweep}"


def train_population(members: list[Member], alone: bool = False) -> list[Outcome]:
    """Train ``members`` (validated configs sharing a group key, their run folders made by Hydra;
    resumed members' with the checkpoint each continues from, ``Member.payload``) as one
    population; write each member's outputs into its run folder; return one
    :class:`~foxdqn.population.jobs.Outcome` per member, in order (exit code 0 finished, 3 halted
    by the guard, 2 bad input found while building or restoring, or a run folder that cannot be
    used: then no member trained and no folder was changed). Every ``checkpoint.every_env_steps`` (at a log boundary) and at the end each
    member's resumable ``checkpoints/last.pt`` is written. On SIGINT/SIGTERM every member's
    checkpoint is written, ``INCOMPLETE`` stays, then :class:`foxdqn.errors.StoppedBySignal`
    (exit code 128 + the signal) is raised, its line saying how to resume (:func:`resume_hint`). ``alone``: ``members`` is one single
    run (:func:`foxdqn.job.run.run_job`), whose summary, log lines and trackers are a single run's
    (no ``population`` entry, no ``job N:`` prefix).
    """
    from foxdqn.errors import FoxdqnError, StoppedBySignal

    try:
        run = _Population(members, alone)
    except FoxdqnError as exc:
        return [Outcome(None, 2, str(exc)) for _ in members]
    try:
        folders = open_folders(members)
    except FoxdqnError as exc:  # a folder that holds another run, or cannot be written: nothing was changed
        run.close()  # the Prometheus endpoint
        return [Outcome(None, 2, str(exc)) for _ in members]
    except BaseException:
        run.close()
        raise
    run.run_ids = [f.run_id for f in folders]
    outcomes: list[Outcome] = []
    signals = None
    interrupted = False
    try:
        run.open_loggers()
        mark("build")  # the run folders and loggers: built before the loop, not counted in its training phase
        with StopSignals() as signals:  # held through the checkpoints: a signal never cuts them short
            try:
                run.iterate(signals)
            finally:
                run.close()
            interrupted = signals.received is not None and run.env_steps < run.total_iters * run.per_iter
            if not interrupted:  # guard.keep_last_good: a halted member's weights from before its last applied update
                for p in range(len(members)):
                    if run.s.guard.reason(p) is not None:
                        run.s.optimizer.restore_last_good(p)
            # the final checkpoints: written while the members are evaluated (their payloads are host
            # copies taken now), on disk before any summary names them; on a signal, before returning
            ckpts = run.save(background=not interrupted)
            mark("checkpoint")
            if not interrupted:
                wall = run.wall()
                with deferred_sync():  # P members' reports, one sync at the end
                    bests = run.keep_best()  # early stopping: the kept weights are evaluated
                    mark("checkpoint")
                    vals, tests = run.evaluate_members()
                    ensembles = run.ensembles()
                    mark("final_evaluation")
                    run.writer.wait()  # the final checkpoints are written (a failure is raised here)
                    mark("checkpoint")
                    outcomes = [run.end_member(p, wall, ckpts[p], vals[p], tests[p], ensembles.get(p), bests[p])
                                for p in range(len(members))]
                    for plot in run.plots:  # after every summary: the results first, then their pictures
                        plot()
                mark("report")
    finally:
        run.writer.join()  # a periodic checkpoint still being written (its failure, if any, is raised by save)
        run.close()  # (again: a failure before the loop leaves the endpoint open otherwise)
        run.end_trackers(outcomes, signals.received if interrupted else None)
        for p, folder in enumerate(folders):
            folder.finish() if p < len(outcomes) else folder.release()
    if interrupted:
        name = signal.Signals(signals.received).name
        if alone:  # a single run's line
            raise StoppedBySignal(f"interrupted by {name} at {run.env_steps} env steps; checkpoint {ckpts[0]}; "
                                  f"continue with resume=auto hydra.run.dir={members[0].run_dir}", signals.received)
        raise StoppedBySignal(f"interrupted by {name} at {run.env_steps} env steps; each member's state is in its "
                              f"checkpoints/last.pt; {resume_hint(members)}", signals.received)
    return outcomes
