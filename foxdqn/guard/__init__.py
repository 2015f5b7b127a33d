"""Host side of the training guard and the Q monitor: the objects the training loop owns.

* :mod:`foxdqn.guard.host`: :class:`~foxdqn.guard.host.TrainingGuard` (device state, thresholds
  and host ring of the guard op) and :class:`~foxdqn.guard.host.GuardTotals` (its accumulators by
  name);
* :mod:`foxdqn.guard.q_monitor`: :class:`~foxdqn.guard.q_monitor.QValueMonitor` and
  :class:`~foxdqn.guard.q_monitor.QTotals`;
* :mod:`foxdqn.device.host_ring`: :class:`~foxdqn.device.host_ring.HostRingReader`, the host's poll of the ring;
* :mod:`foxdqn.device.ring_record`: the ring's record layout.

The kernels they launch (``training_guard``, ``qvalue_stats``) are in :mod:`foxdqn.ops`. Import
the modules directly; this package imports nothing eagerly (the ops import its record layout).
"""
