"""Host side of the training guard and the Q-value monitor: the objects the training loop owns.

* :mod:`foxdqn.guard.host`: :class:`~foxdqn.guard.host.TrainingGuard` (device state, thresholds
  and host ring of the guard op) and :class:`~foxdqn.guard.host.GuardTotals` (its accumulators by
  name);
* :mod:`foxdqn.guard.q_monitor`: :class:`~foxdqn.guard.q_monitor.QValueMonitor` and
  :class:`~foxdqn.guard.q_monitor.QTotals`.

Both write records into the pinned host ring of :mod:`foxdqn.device` (``ring_record.py``, its
layout; ``host_ring.py``, its reader), through the kernels ``training_guard`` and ``qvalue_stats``
of :mod:`foxdqn.ops`. Import the modules directly; this package imports nothing eagerly.
"""
