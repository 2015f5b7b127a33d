"""kill -9 in every phase of a run's life, each kill followed by the same command with resume=auto (a
retry loop): every run ends with the uninterrupted run's results. A file of its own so that
pytest-xdist (--dist loadfile) runs it beside the other resume tests.

The reference run and the process killed during its imports are processes of their own; the others,
killed from Hydra's composition on, are children of conftest's ``cli`` server (support.CliServer:
each the process ``python -m foxdqn.train`` is once its imports are done, running its main in full),
which saves each the 2-3 s of importing torch, Hydra and foxdqn again."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from foxdqn.run.checkpoint import load_checkpoint
from foxdqn.timings import PHASES

ROOT = Path(__file__).resolve().parents[2]
STARTUP = PHASES[:PHASES.index("training")]
AFTER = ("validation", "close", "final_evaluation", "report")  # after the loop: the selection's validation first
#: the kill of each successive process on a run, in the order a run passes them: at the middle of a phase
#: (its place on the reference run's timeline: timings.json), once training has logged a fraction of the
#: run's env steps (metrics.csv), once eval/summary.json is written (the report's other files follow), once
#: the run is finished (INCOMPLETE removed, the process still running)
KILLS = [("phase", "imports"), ("phase", "build"), ("steps", 0.3), ("phase", "build"),  # build: restoring a checkpoint
         ("steps", 0.6), ("steps", 0.9), ("phase", "validation"), ("phase", "final_evaluation"),
         ("file", "eval/summary.json"), ("finished", None)]


def _phase_middle(ref_times: dict, done: float, phase: str, skipped: tuple[str, ...] = ()) -> float:
    """Seconds after its start at which a process is in the middle of ``phase``: the reference run's
    phases in order but ``skipped`` (those a server's child has done before it starts: the
    interpreter's start and the imports), its training loop shortened to the fraction ``1 - done``
    of env steps left."""
    phases = ref_times["phases"]
    loop = phases["training"] + phases.get("periodic_checkpoint", 0.0) + phases["checkpoint"]
    t = 0.0
    for name, length in [(p, phases.get(p, 0.0)) for p in STARTUP if p not in skipped] + \
            [("loop", loop * (1 - done))] + [(p, phases.get(p, 0.0)) for p in AFTER]:
        if name == phase:
            return t + length / 2
        t += length
    raise KeyError(phase)


def _written_since(path: Path, start: float) -> bool:
    try:
        return path.stat().st_mtime >= start
    except FileNotFoundError:
        return False


def _last_step(run_dir: Path) -> int:
    """The step of metrics.csv's last whole row (0 before there is one)."""
    try:
        lines = (run_dir / "metrics.csv").read_text().split("\n")[1:-1]  # the header; the part after the last \n
    except FileNotFoundError:
        return 0
    return int(float(lines[-1].split(",", 1)[0])) if lines else 0


@pytest.mark.slow
def test_kill_9_in_every_phase_then_resume_auto_end_in_the_uninterrupted_results(cli, tmp_path):
    """SIGKILL in every phase of a run's life (start-up before and after Hydra made the folder,
    restoring a checkpoint, training at 30/60/90% of its env steps with its checkpoint writes, the
    selection's validation, the final evaluation, the report with eval/summary.json written, after the
    run finished), each followed by the same command line with resume=auto (a retry loop): every run
    ends with the results of the run that was never killed (summary metrics, final weights,
    metrics.csv rows), holds no partial file, and a killed run is never mistaken for a finished one."""
    python = [sys.executable, "-m", "foxdqn.train"]
    args = ["debug=smoke", "log.progress=false", "device=cpu", "logger=csv", "checkpoint.every_env_steps=512",
            "checkpoint.save_replay=true", "log.interval_env_steps=256", "resume=auto"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ref = subprocess.run([*python, *args, f"hydra.run.dir={tmp_path / 'ref'}"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr[-2000:]
    ref_times = json.loads((tmp_path / "ref" / "timings.json").read_text())
    total_steps = load_checkpoint(tmp_path / "ref" / "checkpoints" / "last.pt")["env_steps"]
    runs = [tmp_path / "run0"]

    def finished(run_dir):
        return (run_dir / "eval" / "summary.json").is_file() and not (run_dir / "INCOMPLETE").exists()

    pending, kills = [(*kill, False) for kill in KILLS], []
    while pending:
        kind, what, retried = pending.pop(0)
        run_dir = runs[-1]
        ckpt = run_dir / "checkpoints" / "last.pt"
        done = load_checkpoint(ckpt)["env_steps"] / total_steps if ckpt.exists() else 0.0
        # a kill during the imports: a process of its own; from the composition on: a child of the server,
        # which starts where a process has done the phases before "compose"
        before_compose = STARTUP[:STARTUP.index("compose")]
        skipped = () if kind == "phase" and what in before_compose else before_compose
        due = {"phase": lambda: time.monotonic() - t0 >= _phase_middle(ref_times, done, what, skipped),
               "steps": lambda: _last_step(run_dir) >= what * total_steps,
               "file": lambda: _written_since(run_dir / what, start),
               "finished": lambda: finished(run_dir)}[kind]
        t0, start = time.monotonic(), time.time()
        if skipped:
            proc = cli.start("foxdqn.train", [*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
        else:
            proc = subprocess.Popen([*python, *args, f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while proc.poll() is None and not due():
            time.sleep(0.005)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills.append((kind, what))
        else:
            err = proc.wait().stderr if skipped else proc.stderr.read()
            assert proc.returncode == 0, err[-2000:]
            if not retried:  # it ended before its moment came: once more, on the next run
                pending.insert(0, (kind, what, True))
        if finished(run_dir):  # it ended (or was killed after its end): the next kills hit a new run
            runs.append(tmp_path / f"run{len(runs)}")
            continue
        if (run_dir / "metrics.csv").exists():  # the run had opened its folder
            assert (run_dir / "INCOMPLETE").exists()  # a killed run is never mistaken for a finished one
        assert all(p.name.startswith(".") for p in run_dir.rglob("*.tmp*"))  # only a killed writer's hidden file
        if ckpt.exists():
            assert load_checkpoint(ckpt)["env_steps"] > 0  # whole: its SHA-256 matches
    # a moment is missed when its process ends before it twice (a loaded machine: the reference run's
    # timeline no longer fits); most moments, and a kill in start-up and one in training, must still land
    assert len(kills) >= len(KILLS) // 2 and {kind for kind, _ in kills} >= {"phase", "steps"}, kills
    reference = _results(tmp_path / "ref")
    for run_dir in runs:
        if not finished(run_dir) and run_dir.exists():
            res = cli("foxdqn.train", [*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=600)
            assert res.returncode == 0, res.stderr[-2000:]
        if not run_dir.exists():  # killed before Hydra made the folder; the last run may not have started
            continue
        assert not list(run_dir.rglob("*.tmp*"))  # the resumed run removed what the killed writers left
        mine = _results(run_dir)
        assert mine["metrics"] == reference["metrics"], run_dir
        assert mine["rows"].equals(reference["rows"]), run_dir
        for key, value in reference["online"].items():
            assert torch.equal(mine["online"][key], value), (run_dir, key)


def _results(run_dir: Path) -> dict:
    """What a run computed: summary metrics, final weights, metrics.csv without its timing column."""
    rows = pd.read_csv(run_dir / "metrics.csv")
    return {"metrics": json.loads((run_dir / "eval" / "summary.json").read_text())["metrics"],
            "online": load_checkpoint(run_dir / "checkpoints" / "last.pt")["online"],
            "rows": rows.drop(columns=[c for c in rows.columns if c.endswith("per_s")]).reset_index(drop=True)}
