"""Running a job: what the Hydra entry (:mod:`foxdqn.train`), its callbacks
(:mod:`foxdqn.cli.callbacks`) and the population launcher
(``hydra_plugins/foxdqn_population``) share, so that none of them imports another's privates.

- :mod:`foxdqn.job.memory`: the replay memory a job needs and how many replays fit on its device;
- :mod:`foxdqn.job.check`: :func:`~foxdqn.job.check.preflight`, every check before any work, and
  the market data a job trains on (loaded once per process);
- :mod:`foxdqn.job.run`: :func:`~foxdqn.job.run.run_job`, one run from its folder's start record to
  its summary, and the objective a sweeper reads;
- :mod:`foxdqn.job.failure`: how a job that cannot run or fails ends (one line and an exit code for
  a single run; a NaN for a sweeper and the worst exit code at the end for a multirun).

The submodules are imported where they are used, not here: ``python -m foxdqn.train --help`` and
the signal handlers of its first lines need none of them.
"""
