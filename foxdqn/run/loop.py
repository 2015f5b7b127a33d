"""The host training loop: replay iterations, poll the guard, log once per interval, evaluate.

Steady state, per iteration: one call of the iteration (one CUDA-graph replay on the GPU) and a
poll of the guard's pinned host ring (a plain memory read, never a wait). Once per log interval:
one device→host copy of all monitoring accumulators (:meth:`DeviceStats.snapshot`). At the end
(or on a halt): checkpoint, evaluation on the test split, report.
"""
from __future__ import annotations

import logging
import math
import signal
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from foxdqn.run import search
from foxdqn.run.checkpoint import restore_state, save_checkpoint
from foxdqn.config.schema import TrainConfig
from foxdqn.device.host_ring import FLAG_FIELDS
from foxdqn.run.early_stop import EarlyStopper, resolve_metric
from foxdqn.errors import ConfigError, HaltError
from foxdqn.run.finish import Agent, RunEnd, evaluate_val, finish
from foxdqn.run.trackers import Trackers, open_prometheus
from foxdqn.guard.host import GuardTotals
from foxdqn.guard.q_monitor import QTotals
from foxdqn.io_atomic import write_text_atomic
from foxdqn.logger import MetricsLogger
from foxdqn.logger.detail import DETAIL
from foxdqn.logger.diversity import CollapseMonitor, action_diversity, entropy, format_top, top_actions
from foxdqn.logger.progress import TrainProgress
from foxdqn.step import stats as S
from foxdqn.step.iteration import make_iteration
from foxdqn.step.state import TrainState, build_state, resolve_device
from foxdqn.timings import mark


log = logging.getLogger(__name__)


def use_graph(cfg: TrainConfig, device: torch.device) -> bool:
    if cfg.graph == "on" and device.type != "cuda":
        raise ConfigError("graph=on needs a CUDA device; use graph=auto or graph=off on CPU")
    return cfg.graph == "on" or (cfg.graph == "auto" and device.type == "cuda")


class IterationPlan(NamedTuple):
    """The iteration counts of a run, from its config: ``per_iter`` env steps of all N envs per
    iteration (N·T), ``total_iters`` iterations (at least 1), the first ``warm_iters`` of them
    collect-only (``agent.learning_starts``), a log row every ``log_every`` iterations. Shared by
    the single run and the population (env steps of one member)."""

    per_iter: int
    total_iters: int
    warm_iters: int
    log_every: int

    @classmethod
    def of(cls, cfg: TrainConfig) -> "IterationPlan":
        a = cfg.agent
        per_iter = cfg.env.num_envs * a.steps_per_iter
        total = max(1, math.ceil(a.total_env_steps / per_iter))
        return cls(per_iter, total, min(total, math.ceil(a.learning_starts / per_iter)),
                   max(1, cfg.log.interval_env_steps // per_iter))


class Snapshotter:
    """Turns one host copy of the device accumulators into a log row, then resets them.

    The copy (:meth:`DeviceStats.snapshot`, the log interval's one host sync) carries the
    monitoring accumulators, the guard's and the Q monitor's accumulators (read by name through
    :class:`GuardTotals` and :class:`QTotals`), ε of the next collect step as the device computes
    it, and the pruner's sparsities. After a call, ``actions`` holds the interval's executed-action
    counts (float64 numpy ``[A]``) and ``epsilon`` that ε (float); with ``diversity.enabled`` the
    row also carries :func:`foxdqn.logger.diversity.action_diversity`.
    """

    def __init__(self, s: TrainState):
        self.s = s
        self.actions = np.zeros(s.monitors.stats.actions.numel())
        self.epsilon = float("nan")
        self.factored = s.cfg.env.name == "trading"

    def _read(self) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """(stats acc, action counts, {part: host values}) from one device→host copy."""
        s, m = self.s, self.s.monitors
        parts = {"guard": m.guard.acc, "q": m.qmon.acc, "epsilon": s.schedules.epsilon(s.env_steps)}
        if s.pruner is not None:
            parts["prune"] = s.pruner.log_values(s.updates)  # [measured, scheduled]
        host = m.stats.snapshot(*parts.values()).numpy()
        nf, na = S.NUM_FIELDS, m.stats.actions.numel()
        views, offset = {}, nf + na
        for name, tensor in parts.items():
            views[name] = host[offset: offset + tensor.numel()]
            offset += tensor.numel()
        return host[:nf], host[nf:nf + na], views

    def __call__(self) -> dict:
        s, m = self.s, self.s.monitors
        acc, actions, views = self._read()
        g, q = GuardTotals.from_host(views["guard"]), QTotals.from_host(views["q"])
        self.actions, self.epsilon = actions.copy(), float(views["epsilon"][0])
        m.stats.reset()
        m.guard.reset_accumulators()
        m.qmon.reset()
        row = {
            "episodes": acc[S.EP_COUNT],
            "episode_return": acc[S.EP_RETURN_SUM] / acc[S.EP_COUNT] if acc[S.EP_COUNT] else float("nan"),
            "reward_per_step": acc[S.REWARD_SUM] / max(acc[S.TRANSITIONS], 1),
            "fill_rate": acc[S.TRADES] / max(acc[S.TRANSITIONS], 1),
            "action_entropy": entropy(actions),
            "loss": g.mean_loss,
            "grad_norm": g.mean_grad_norm,
            "skipped_updates": g.skipped,
            "mean_max_q": q.mean_max_q,
        }
        if s.cfg.diversity.enabled:
            row.update(action_diversity(actions, self.factored))
        if s.pruner is not None:  # prune.enabled: sparsity reached (fraction of zero weights) and scheduled
            row["prune_sparsity"], row["prune_target_sparsity"] = views["prune"][:2]
        return row


class Interrupted(Exception):
    """The run stopped on SIGINT or SIGTERM after its current iteration; a checkpoint was written.

    ``exit_code`` is 128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signum: int, env_steps: int, checkpoint: Path) -> None:
        self.signum, self.env_steps, self.checkpoint = signum, env_steps, checkpoint
        self.exit_code = 128 + signum
        super().__init__(f"interrupted by {signal.Signals(signum).name} at {env_steps} env steps; checkpoint "
                         f"{checkpoint}; continue with resume=auto hydra.run.dir={checkpoint.parent.parent}")


class _StopSignals:
    """While active, SIGINT and SIGTERM set :attr:`received` (the loop stops after its iteration and
    writes its checkpoint) instead of killing the process; more signals while it stops are ignored,
    so a checkpoint is never cut short. The previous handlers come back on exit."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._old: dict = {}

    def _handle(self, signum, frame) -> None:
        self.received = self.received or signum

    def __enter__(self) -> "_StopSignals":
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def train(cfg: TrainConfig, market, run_dir: Path, resume: dict | None = None, run_id: str | None = None) -> dict:
    """:func:`prepare` then :func:`run_prepared`: train, evaluate on ``cfg.eval.split`` and write the run's outputs into ``run_dir``.

    With ``early_stop.enabled`` the run may end early (foxdqn.run.early_stop) and the evaluation uses
    ``checkpoints/best.pt``; the summary's ``stop`` / ``evaluated`` entries say which. Action
    diversity (foxdqn.logger.diversity) is logged at log boundaries when ``diversity.enabled``.
    ``checkpoints/last.pt`` (foxdqn.run.checkpoint) is rewritten every ``checkpoint.every_env_steps``
    (at the first log boundary past each multiple), at the end, on a halt and on SIGINT/SIGTERM.

    Args:
        cfg, market, run_dir: the validated config, its market data (trading) and the run folder.
        resume: a checkpoint payload (:func:`foxdqn.run.checkpoint.load_checkpoint`) of this run to
            continue from: state, counters, generators and loop state are restored, metrics.csv
            keeps its rows up to the checkpoint and continues.
        run_id: the run's id (:mod:`foxdqn.run.folder`), written into its checkpoints.

    Raises:
        HaltError: a guard flag fired (the checkpoint of the last good weights is written first:
            those from before the last applied update, with ``guard.keep_last_good``).
        Interrupted: SIGINT or SIGTERM (the checkpoint is written first).
    """
    return run_prepared(prepare(cfg, market, run_dir, resume, run_id))


def prepare(cfg: TrainConfig, market, run_dir: Path, resume: dict | None = None,
            run_id: str | None = None) -> "_Training":
    """The build phase of :func:`train`: env, networks, replay, optimizer, monitors, loggers and
    the restored checkpoint. An error here means no training step ran (the caller may remove a
    new run folder). Raises ConfigError, OSError, MemoryError or torch's out-of-memory error."""
    return _Training(cfg, market, run_dir, resume, run_id)


def run_prepared(run: "_Training") -> dict:
    """The training phase of :func:`train` for a run made by :func:`prepare`: iterate, checkpoint, evaluate."""
    market, run_dir = run.market, run.run_dir
    try:
        with _StopSignals() as signals:  # held through the final checkpoint: a signal never cuts it short
            try:
                run.iterate(signals)
            finally:
                run.close()
            if run.halt is not None and run.s.optim.last_good is not None:
                run.s.optim.last_good.restore()  # the weights from before the last applied update
            ckpt = run.checkpoint()
            mark("checkpoint")
        run.raise_if_stopped(signals, ckpt)
        summary = finish(Agent.of(run.s), market, run_dir,
                         RunEnd(run.graph, run.wall(), int(run.s.env_steps.item()), int(run.s.updates.item()), ckpt,
                                run.stopper, run.collapse, run.best_path, extra=run.trackers.summary(),
                                pruned_at=run.pruned_at))
        if run.trial_pruner is not None:  # this job's validation values now count for the sweep's median
            run.trial_pruner.finish(pruned=run.pruned_at is not None)
    except BaseException:  # a halt, a signal or an error: the MLflow and W&B runs say so
        run.trackers.end("FAILED", 1)  # (a halt or a signal ended them already, as such)
        raise
    run.trackers.report(summary, run_dir)
    return summary


class _Training:
    """One call of :func:`train`, in the order it runs: setup (``__init__``, :func:`prepare`), the iteration loop
    (:meth:`iterate`) with its guard poll, log boundary, eval boundary and periodic checkpoint,
    then :meth:`close`, the final :meth:`checkpoint` and :meth:`raise_if_stopped`."""

    def __init__(self, cfg: TrainConfig, market, run_dir: Path, resume: dict | None, run_id: str | None = None) -> None:
        self.t0 = time.perf_counter()
        self.cfg, self.market, self.run_dir = cfg, market, run_dir
        self.device = resolve_device(cfg.device)
        self.graph = use_graph(cfg, self.device)
        self.s = s = build_state(cfg, market, self.device)
        a = cfg.agent
        self.per_iter, self.total_iters, self.warm_iters, self.log_every = IterationPlan.of(cfg)
        per_iter = self.per_iter
        self.stopper = EarlyStopper(cfg.early_stop, cfg.env.name) if cfg.early_stop.enabled else None
        self.collapse = CollapseMonitor(cfg.diversity.min_entropy, cfg.diversity.patience)
        # the loop's numbers saved with each checkpoint (restored on resume), with the two monitors' state
        self.host = {"recent_return": float("nan"), "wall_before": 0.0}
        self.run_id = run_id
        self.start_iter = 0
        if resume is not None:
            self._restore(resume)
        log.info("%s: %s on %s (graph=%s), %d env steps in %d iterations of %d envs x %d steps, %d updates each",
                 cfg.experiment, cfg.env.name if market is None else market.source, self.device, self.graph,
                 self.total_iters * per_iter, self.total_iters, cfg.env.num_envs, a.steps_per_iter,
                 a.updates_per_iter)
        self.collect_only = make_iteration(s, self.graph, updates=0)
        self.full = make_iteration(s, self.graph)  # host envs (env=gym): eager collect, captured update-only graph
        self.eval_every = max(1, cfg.eval.interval_env_steps // per_iter) if cfg.eval.interval_env_steps else 0
        self.snapshot = Snapshotter(s)
        self.trackers = Trackers(cfg, run_dir)  # the MLflow and W&B runs (logger.mlflow, logger.wandb)
        self.prometheus = open_prometheus(cfg)  # None unless logger.prometheus.port; the logger closes it
        self.logger = MetricsLogger(run_dir, tensorboard=cfg.logger.tensorboard,
                                    resume_after=None if resume is None else int(resume["env_steps"]),
                                    sinks=self.trackers.sinks, prometheus=self.prometheus)
        self.trial_pruner, self.pruned_at = search.trial_pruner(cfg), None  # search.pruner=median in a --multirun
        self.trial_metric = resolve_metric(cfg.early_stop.metric, cfg.env.name)
        self.best_path, self.last_path = run_dir / "checkpoints" / "best.pt", run_dir / "checkpoints" / "last.pt"
        self.halt: str | None = None
        self.host_updates = 0 if resume is None else int(resume["updates"])  # the device counter, without a read
        self.env_steps = self.start_iter * per_iter
        self.t_log, self.steps_log = time.perf_counter(), self.env_steps
        mark("build")  # foxdqn.timings; warm-up and capture are marked by the iterations

    def _restore(self, resume: dict) -> None:
        """Continue from checkpoint ``resume``: device state, loop state and the iteration to start at."""
        a = self.cfg.agent
        restore_state(self.s, resume)
        loop = resume["loop"]
        if self.stopper is not None and loop.get("stopper") is not None:
            self.stopper.load_state_dict(loop["stopper"])
        self.collapse.load_state_dict(loop["collapse"])
        self.host.update(recent_return=float(loop["recent_return"]), wall_before=float(loop["wall_before"]))
        self.start_iter = int(resume["env_steps"]) // self.per_iter
        log.info("resuming at %d env steps (iteration %d of %d)", resume["env_steps"], self.start_iter,
                 self.total_iters)
        if not resume["replay_saved"]:  # an empty replay: collect agent.learning_starts transitions first
            refill = math.ceil(a.learning_starts / self.per_iter)
            self.warm_iters = max(self.warm_iters, min(self.total_iters, self.start_iter + refill))
            log.warning("the checkpoint has no replay (checkpoint.save_replay=false): %d collect-only iterations "
                        "refill it before updates continue; the run is not an exact continuation", refill)

    # -- the iteration loop ------------------------------------------------------------------
    def iterate(self, signals: "_StopSignals") -> None:
        """Run the iterations from ``start_iter`` until the last, a halt, an early stop or a signal."""
        cfg, per_iter = self.cfg, self.per_iter
        with TrainProgress(total=self.total_iters * per_iter, enabled=cfg.log.progress,
                           initial=self.start_iter * per_iter) as progress:
            for it in range(self.start_iter, self.total_iters):
                (self.collect_only if it < self.warm_iters else self.full)()
                self.host_updates += 0 if it < self.warm_iters else cfg.agent.updates_per_iter
                self.env_steps = (it + 1) * per_iter
                last = it == self.total_iters - 1
                if self._guard_fired():
                    break
                if ((it + 1) % self.log_every == 0 or last) and self._log_boundary(progress, last):
                    break
                # with early stopping the final weights are validated too (they compete for "best")
                if self.eval_every and (((it + 1) % self.eval_every == 0 and not last) or
                                        (self.stopper is not None and last)) and self._eval_boundary(it, last):
                    break
                if signals.received is not None and not last:
                    break
                if self._checkpoint_due(it, last):
                    mark("training")
                    self.checkpoint()
                    mark("checkpoint")

    def _guard_fired(self) -> bool:
        """Poll the guard's ring (a pinned memory read, no wait); on a flag set :attr:`halt` (or stop
        early on a Q divergence alone with ``early_stop.on_q_divergence``) and return True."""
        reader = self.s.monitors.guard.reader
        record = reader.latest()
        if self.prometheus is not None:  # the record just read: Python numbers, no further read
            self.prometheus.observe(record)
        reason = reader.halt_reason(record) if record is not None else None
        if reason is None:
            return False
        first = reader.first_halt()  # name the flag of the update that fired, not the latch after it
        self.halt = reader.halt_reason(first) if first is not None else reason
        if self.stopper is not None and self.cfg.early_stop.on_q_divergence and _q_divergence_only(record, first):
            self.stopper.stop("early_stop_q", self.env_steps, f"Q monitor: {self.halt}")
            self.halt = None
        return True

    def _log_boundary(self, progress, last: bool) -> bool:
        """Read the accumulators back (the interval's one sync), log a row; True: stop early (Q)."""
        cfg, env_steps, host, stopper = self.cfg, self.env_steps, self.host, self.stopper
        row = self.snapshot()
        now = time.perf_counter()
        row["env_steps_per_s"] = (env_steps - self.steps_log) / max(now - self.t_log, 1e-9)
        self.t_log, self.steps_log = now, env_steps
        row["epsilon"] = self.snapshot.epsilon
        row["updates"] = self.host_updates
        if not math.isnan(row["episode_return"]):
            host["recent_return"] = float(row["episode_return"])
        self.logger.log(env_steps, {f"train/{k}": v for k, v in row.items()})
        fields = {"eps": row["epsilon"], "loss": row["loss"], "ep_ret": host["recent_return"]}
        if cfg.diversity.enabled:
            fields["H"] = row["action_entropy_norm"]
            _log_diversity(row, self.snapshot, self.collapse, env_steps, cfg.diversity.top_k)
        progress.update(env_steps, fields)
        if stopper is not None and stopper.update_q(row["mean_max_q"]) and not last:
            stopper.stop("early_stop_q", env_steps, stopper.q_detail(row["mean_max_q"]))
            return True
        return False

    def _eval_boundary(self, it: int, last: bool) -> bool:
        """Validate, log, keep the best weights (early stopping); True: stop early (validation)."""
        s, stopper, env_steps = self.s, self.stopper, self.env_steps
        mark("training")
        metrics = evaluate_val(Agent.of(s), self.market)
        self.logger.log(env_steps, {f"val/{k}": v for k, v in metrics.items()})
        mark("validation")
        if self.trial_pruner is not None and it >= self.warm_iters and not last and self.trial_pruner.report(
                env_steps, float(metrics.get(self.trial_metric, float("nan")))):
            self.pruned_at = env_steps  # search.pruner=median: below the sweep's median at this step
            return True
        if stopper is None or it < self.warm_iters:  # no update yet: the weights cannot improve
            return False
        if stopper.update_val(env_steps, metrics):
            save_checkpoint(self.best_path, s, {"best": {"metric": stopper.metric, "value": stopper.best}},
                            run_id=self.run_id)
            mark("checkpoint")
            log.info("best val %s = %.6g at %d env steps -> %s", stopper.metric, stopper.best, env_steps,
                     self.best_path.name)
        if stopper.val_exhausted and not last:
            stopper.stop("early_stop_val", env_steps, stopper.val_detail())
            return True
        return False

    # -- checkpoint and end ------------------------------------------------------------------
    def _checkpoint_due(self, it: int, last: bool) -> bool:
        """A log boundary past a multiple of ``checkpoint.every_env_steps`` (not the last iteration)."""
        every = self.cfg.checkpoint.every_env_steps
        return bool(every) and not last and (it + 1) % self.log_every == 0 and \
            self.env_steps // every > (self.env_steps - self.log_every * self.per_iter) // every

    def wall(self) -> float:
        """Training wall time in seconds, over all runs of this training (resumes included)."""
        return self.host["wall_before"] + time.perf_counter() - self.t0

    def checkpoint(self) -> Path:
        """Write ``checkpoints/last.pt``; the loop state saved with it carries the wall time so far."""
        loop_state = {"stopper": None if self.stopper is None else self.stopper.state_dict(),
                      "collapse": self.collapse.state_dict(), "recent_return": float(self.host["recent_return"]),
                      "wall_before": self.wall()}
        return save_checkpoint(self.last_path, self.s, loop=loop_state, save_replay=self.cfg.checkpoint.save_replay,
                               run_id=self.run_id)

    def close(self) -> None:
        """Wait for the device, close the metrics logger (and its Prometheus endpoint) and host env workers."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        mark("training")  # the device has finished every iteration
        self.logger.close()
        self.s.rollout.env.close()  # host vector envs: end their workers
        mark("close")

    def raise_if_stopped(self, signals: "_StopSignals", ckpt: Path) -> None:
        """Raise HaltError after a guard halt (writing ``HALTED``), Interrupted after a signal."""
        if self.halt is not None:
            self.trackers.end("FAILED", 1)
        elif signals.received is not None:
            self.trackers.end("KILLED", 128 + signals.received)
        if self.halt is not None:
            log.error("halted: %s", self.halt)
            write_text_atomic(self.run_dir / "HALTED", self.halt + "\n")
            raise HaltError(f"{self.halt}; last good weights saved to {ckpt}")
        if signals.received is not None and self.env_steps < self.total_iters * self.per_iter:
            raise Interrupted(signals.received, self.env_steps, ckpt)


def _q_divergence_only(latest: dict, first: dict | None) -> bool:
    """The halt seen is the Q monitor's divergence flag alone (no guard flag, no device latch)."""
    guard = (*(f for f in FLAG_FIELDS if f != "q_divergence"), "halted")
    return all(not rec[f] for rec in (latest, first) if rec is not None for f in guard)


def _log_diversity(row: dict, snapshot: Snapshotter, collapse: CollapseMonitor, env_steps: int, top_k: int) -> None:
    """Python log line of the interval's action diversity; feeds the collapse monitor."""
    top = top_actions(snapshot.actions, top_k, snapshot.factored)
    parts = [f"H={row['action_entropy']:.3f} nats ({row['action_entropy_norm']:.2f} of max)"]
    if snapshot.factored:
        parts += [f"{name} {row[f'{name}_entropy_norm']:.2f}" for name in ("exposure", "order_type", "urgency")]
    log.info("actions at %d env steps: %s; top: %s", env_steps, ", ".join(parts), format_top(top), extra=DETAIL)
    collapse.update(row["action_entropy_norm"], env_steps, top)
