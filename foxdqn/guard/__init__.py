"""Host side of the training guard and the Q monitor: the objects the training loop owns.

* :mod:`foxdqn.guard.guard`: :class:`~foxdqn.guard.guard.TrainingGuard` (device state, thresholds
  and host ring of the guard op) and :class:`~foxdqn.guard.guard.GuardTotals` (its accumulators by
  name);
* :mod:`foxdqn.guard.monitor`: :class:`~foxdqn.guard.monitor.QValueMonitor` and
  :class:`~foxdqn.guard.monitor.QTotals`;
* :mod:`foxdqn.guard.ring`: :class:`~foxdqn.guard.ring.HostRingReader`, the host's poll of the ring;
* :mod:`foxdqn.guard.record`: the ring's record layout.

The kernels they launch (``training_guard``, ``qvalue_stats``) are in :mod:`foxdqn.ops`. Import
the modules directly; this package imports nothing eagerly (the ops import its record layout).
"""
