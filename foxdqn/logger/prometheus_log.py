"""A Prometheus endpoint for a training run (``prometheus_client``), fed from host values only.

:class:`PrometheusExporter` serves ``http://ADDR:PORT/metrics`` from a daemon thread with its own
registry (two exporters in one process, e.g. the jobs of a multirun or tests, never share gauges).
It is fed in two ways at each log boundary, neither of which touches a device tensor:

* :meth:`PrometheusExporter.log` - the rows of ``metrics.csv`` (the host values of the log
  interval's one readback). Column ``train/loss`` becomes the gauge ``foxdqn_train_loss``:
  ``foxdqn_`` plus the column name with every character outside ``[a-zA-Z0-9_]`` turned into
  ``_``. The row's step is ``foxdqn_env_steps``.
* :meth:`PrometheusExporter.guard` - a population member's guard state
  (:meth:`foxdqn.population.member_guard.MemberGuard.gauges`: the host copy the log interval's one
  readback made current; no read of its own):

  ==================================  =====================================================
  ``foxdqn_guard_flag{flag=F}``       1 or 0; F in halt_nan, halt_loss_clip, halt_grad_collapse,
                                      halt_weight, q_divergence (why the member halted, latched
                                      from that update on; q_divergence also while its last
                                      update's Q diverged), skip (its updates are skipped: halted,
                                      early-stopped or pruned), halted (a guard halt)
  ``foxdqn_guard_step``               the member's newest update number (-1: no update yet)
  ``foxdqn_guard_collapse_count``     consecutive updates with a collapsed gradient (0 while
                                      ``guard.collapse_multiplier`` is off for every member)
  ``foxdqn_guard_halt_updates``       updates applied when it halted or stopped (-1: running)
  ``foxdqn_guard_halt_env_steps``     its env steps then (-1: running)
  ==================================  =====================================================

  Per-update values (an update's raw loss, gradient norm, Q min/max/mean) are not exported: the
  interval means are the row gauges ``foxdqn_train_loss``, ``foxdqn_train_grad_norm`` and
  ``foxdqn_train_mean_max_q``.

Every gauge carries the labels given at construction (``run``) and, per row, the row labels (a
population's endpoint, foxdqn.population.train: the member's ``member`` (its index), ``job`` (its
Hydra job number) and ``seed``): one series per member. A single run is a population of one
(member 0, job 0). Values are converted with ``float``; ``None`` and strings are skipped; tensors
are refused (``TypeError``), as in the other sinks.
"""
from __future__ import annotations

import numbers
import re
import socket
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["PrometheusExporter", "LabelledRows", "probe", "metric_name", "FLAGS", "GUARD_VALUES"]

PREFIX = "foxdqn_"
ENV_STEPS_HELP = "env steps of the last logged metrics row"
#: The guard's flags exposed as ``foxdqn_guard_flag{flag=...}`` (keys of MemberGuard.gauges).
FLAGS = ("halt_nan", "halt_loss_clip", "halt_grad_collapse", "halt_weight", "q_divergence", "skip", "halted")
#: gauge name (after ``foxdqn_``) -> help text: a population member's guard values (:meth:`PrometheusExporter.guard`)
GUARD_VALUES = {
    "guard_step": "the member's newest update number at the last log boundary (-1: none yet)",
    "guard_collapse_count": "the member's consecutive updates with a collapsed gradient",
    "guard_halt_updates": "updates applied to the member when it halted or stopped (-1: running)",
    "guard_halt_env_steps": "the member's env steps when it halted or stopped (-1: running)",
}
def metric_name(column: str) -> str:
    """The gauge name of a metrics.csv column: ``"train/loss"`` -> ``"foxdqn_train_loss"``."""
    return PREFIX + re.sub(r"[^a-zA-Z0-9_]", "_", column)


def _number(name: str, value: Any) -> float | None:
    """``value`` as a float, None to skip it (None, strings). Raises TypeError for tensors."""
    if value is None or isinstance(value, str):
        return None
    if type(value).__module__.split(".")[0] == "torch":
        raise TypeError(f"{name}: got a {type(value).__name__}; the Prometheus exporter takes host values, "
                        "never tensors (a device read would be a sync)")
    if not isinstance(value, numbers.Real) and not hasattr(value, "__float__"):
        raise TypeError(f"{name}: value {value!r} is not a number")
    return float(value)


def probe(port: int, addr: str = "127.0.0.1") -> None:
    """Check that ``addr:port`` can be bound now, as the exporter's server binds it, then free it.

    Raises:
        socket.gaierror: ``addr`` does not resolve.
        OSError: the port cannot be bound (``errno.EADDRINUSE``: in use; ``EACCES``: a privileged port).
    """
    family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server does
        sock.bind(sockaddr)


class PrometheusExporter:
    """Serve the run's gauges on ``http://addr:port/metrics`` until :meth:`close`.

    Args:
        port: TCP port (0: any free port; :attr:`port` tells which).
        addr: address to bind (default loopback only).
        labels: label name -> value put on every gauge (e.g. ``{"run": ...}``).
        row_labels: names of labels whose values each :meth:`log` and :meth:`guard` call gives (a
            population's ``("member", "job", "seed")``: one series per member, so members never
            overwrite each other's gauges). Empty: every row sets the same series.

    Raises:
        socket.gaierror: ``addr`` does not resolve.
        OSError: the port cannot be bound (in use, privileged, not an address of this machine).

    Usage::

        with PrometheusExporter(9464, labels={"run": "eurusd_dqn"}, row_labels=("member",)) as prom:
            member = prom.rows({"member": 0})
            member.log(env_steps, {"train/loss": 0.1})  # every log boundary
            member.guard(guard.gauges(0, updates))
    """

    def __init__(self, port: int, addr: str = "127.0.0.1", labels: Mapping[str, str] | None = None,
                 row_labels: Sequence[str] = ()) -> None:
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self._Gauge = Gauge
        self.labels = {str(k): str(v) for k, v in (labels or {}).items()}
        self.row_labels = tuple(str(n) for n in row_labels)
        self.registry = CollectorRegistry(auto_describe=True)
        self._families: dict[str, Any] = {}  # gauge name -> Gauge
        self._rows: dict[tuple[str | None, tuple[str, ...]], Any] = {}  # (column or None: env steps, row labels) -> series
        if not self.row_labels:
            self._series(f"{PREFIX}env_steps", ENV_STEPS_HELP, ()).set(float("nan"))  # no row yet
        self._server, self._thread = start_http_server(int(port), addr=addr, registry=self.registry)
        self.addr, self.port = addr, int(self._server.server_port)

    def _series(self, name: str, text: str, values: tuple[str, ...], extra: tuple[str, ...] = ()):
        """The gauge ``name``'s series of this exporter's labels and the row label ``values`` (then
        the values of the labels ``extra``, e.g. the guard flag's ``flag``)."""
        gauge = self._families.get(name)
        if gauge is None:
            gauge = self._families[name] = self._Gauge(name, text, (*self.labels, *self.row_labels, *extra),
                                                       registry=self.registry)
        return gauge.labels(*self.labels.values(), *values) if self.labels or values else gauge

    def rows(self, labels: Mapping[str, Any]) -> "LabelledRows":
        """A sink whose ``log(step, metrics)`` is :meth:`log` with the row labels ``labels`` (one
        population member's :class:`~foxdqn.logger.MetricsLogger` sink). It never closes the exporter.

        Raises:
            ValueError: the names of ``labels`` are not :attr:`row_labels`.
        """
        return LabelledRows(self, self._row_values(labels))

    def _row_values(self, labels: Mapping[str, Any] | None) -> tuple[str, ...]:
        given = dict(labels or {})
        if set(given) != set(self.row_labels):
            raise ValueError(f"row labels {sorted(given)}: this exporter's are {sorted(self.row_labels)}")
        return tuple(str(given[n]) for n in self.row_labels)

    @property
    def url(self) -> str:
        """The scrape address, ``http://addr:port/metrics``."""
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def log(self, step: int, metrics: Mapping[str, Any], labels: Mapping[str, Any] | None = None) -> None:
        """Set one gauge per numeric entry of a metrics row (``metric_name(column)``) and
        ``foxdqn_env_steps`` to ``step``; ``labels`` gives the values of :attr:`row_labels`
        (None when there are none).

        Raises:
            TypeError: a value is a tensor or not a number.
            ValueError: the names of ``labels`` are not :attr:`row_labels`.
        """
        values = self._row_values(labels)
        steps = self._rows.get((None, values))  # None: no column's key
        if steps is None:
            steps = self._rows[(None, values)] = self._series(f"{PREFIX}env_steps", ENV_STEPS_HELP, values)
        steps.set(_number("step", step))
        for column, value in metrics.items():
            v = _number(column, value)
            if v is None:
                continue
            gauge = self._rows.get((column, values))
            if gauge is None:
                gauge = self._rows[(column, values)] = self._series(metric_name(column), f"metrics.csv column {column}",
                                                                    values)
            gauge.set(v)

    def guard(self, values: Mapping[str, Any], labels: Mapping[str, Any] | None = None) -> None:
        """Set a population member's guard gauges (the module docstring's second table) from
        ``values``: each name of :data:`FLAGS` -> 0/1 and each key of :data:`GUARD_VALUES` -> a
        number (host values, :meth:`foxdqn.population.member_guard.MemberGuard.gauges`); ``labels``
        gives the values of :attr:`row_labels`. A missing key leaves its gauge as it was.

        Raises:
            TypeError: a value is a tensor or not a number.
            ValueError: the names of ``labels`` are not :attr:`row_labels`.
        """
        row = self._row_values(labels)
        for flag in FLAGS:
            if flag in values:
                self._series(f"{PREFIX}guard_flag", "guard flags of the member at the last log boundary (1 set, 0 clear)",
                             (*row, flag), extra=("flag",)).set(_number(flag, values[flag]))
        for name, text in GUARD_VALUES.items():
            if name.removeprefix("guard_") in values:
                self._series(PREFIX + name, text, row).set(_number(name, values[name.removeprefix("guard_")]))

    def close(self) -> None:
        """Stop serving and free the port (idempotent; returns within about 0.5 s)."""
        server, self._server = getattr(self, "_server", None), None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> PrometheusExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LabelledRows:
    """One population member's rows into a shared :class:`PrometheusExporter` (:meth:`PrometheusExporter.rows`)."""

    def __init__(self, exporter: PrometheusExporter, values: tuple[str, ...]) -> None:
        self.exporter, self.labels = exporter, dict(zip(exporter.row_labels, values))

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """:meth:`PrometheusExporter.log` of this member's row."""
        self.exporter.log(step, metrics, self.labels)

    def guard(self, values: Mapping[str, Any]) -> None:
        """:meth:`PrometheusExporter.guard` of this member's guard state."""
        self.exporter.guard(values, self.labels)
