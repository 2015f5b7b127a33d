"""``python tests/population/fake_trainer_run.py ARGS...``: ``python -m foxdqn.train ARGS`` with
``foxdqn.population.train.train_population`` replaced by a fake (for tests/population/test_launcher.py).

The fake trains nothing (a job that trains alone, ``alone=True``, gets the real trainer): for each call it appends one JSON line to ``$FAKE_POPULATION_CALLS`` (the
members it got: job number, run folder, seed, model.hidden, optim.lr, overrides), writes an
``eval/summary.json`` with a ``selection`` entry (value :func:`fake_value`) into each member's run
folder and returns the Outcomes; a member whose seed is ``$FAKE_HALT_SEED`` halts instead
(exit code 3). :class:`RecordReturns` is a Hydra callback (``+hydra.callbacks.record._target_=
__main__.RecordReturns``) that appends each job's ``on_job_end`` to ``$FAKE_JOB_ENDS``: its number,
return value and whether its summary exists by then.
"""
import json
import math
import os
import sys
import types
from pathlib import Path

from hydra.experimental.callback import Callback


def fake_value(seed: int, hidden: list[int], lr: float) -> float:
    """The validation value the fake reports for a member (distinct for every seed, width and
    learning rate below 1e-3)."""
    return 1000.0 + 10.0 * seed + hidden[0] + 1e3 * lr


#: the real trainer, which a single run (a job that trains alone: ``alone=True``) still gets
REAL = {}


def fake_train_population(members, alone=False):
    from foxdqn.population.jobs import Outcome

    if alone:  # a job that trains alone is a population of one of the real trainer (foxdqn.job.run.run_job)
        return REAL["train_population"](members, alone=True)

    with open(os.environ["FAKE_POPULATION_CALLS"], "a") as f:
        f.write(json.dumps([{"job": m.job_num, "run_dir": str(m.run_dir), "seed": m.tc.seed,
                             "hidden": list(m.tc.model.hidden), "lr": m.tc.optim.lr, "overrides": m.overrides}
                            for m in members]) + "\n")
    halt = os.environ.get("FAKE_HALT_SEED")
    out = []
    for m in members:
        if halt is not None and m.tc.seed == int(halt):
            out.append(Outcome(None, 3, "training halted: fake halt"))
            continue
        value = fake_value(m.tc.seed, list(m.tc.model.hidden), m.tc.optim.lr)
        summary = {"experiment": m.tc.experiment, "run_name": m.tc.experiment, "device": "cpu", "gpu": None,
                   "env_steps": 0, "wall_time_s": 0.0, "stop": {"reason": "completed"},
                   "selection": {"split": "val", "metric": "mean_return", "value": value, "weights": "last"},
                   "env": str(m.tc.env.name), "metrics": {"agent": {"mean_return": value}}}
        (m.run_dir / "eval").mkdir(parents=True, exist_ok=True)
        (m.run_dir / "eval" / "summary.json").write_text(json.dumps(summary))
        out.append(Outcome(summary, 0, ""))
    return out


class RecordReturns(Callback):
    """Hydra callback: each job's on_job_end (number, return value, summary written by then)."""

    def on_job_end(self, config, job_return=None, **kwargs):
        run_dir = Path(str(config.hydra.runtime.output_dir))
        value = job_return.return_value
        with open(os.environ["FAKE_JOB_ENDS"], "a") as f:
            f.write(json.dumps({"job": int(config.hydra.job.num),
                                "value": None if value is None or math.isnan(value) else value,
                                "summary": (run_dir / "eval" / "summary.json").is_file()}) + "\n")


if __name__ == "__main__":
    try:
        import foxdqn.population.train as module
    except ModuleNotFoundError as exc:  # the population trainer is not in this tree yet
        if exc.name != "foxdqn.population.train":
            raise
        import foxdqn.population

        module = types.ModuleType("foxdqn.population.train")
        sys.modules[module.__name__] = module
        foxdqn.population.train = module
    REAL["train_population"] = module.train_population
    module.train_population = fake_train_population

    from foxdqn.train import main

    sys.argv = ["foxdqn.train", *sys.argv[1:]]
    main()
