"""A worker process of ``hydra/launcher=population`` with ``n_jobs`` > 1: populations on one GPU.

``python -m foxdqn.population.worker IN OUT`` reads a pickled list of groups (each a list of
:class:`~foxdqn.population.jobs.Member`), trains them one after another with
:func:`~foxdqn.population.train.train_population` on the GPU its ``CUDA_VISIBLE_DEVICES`` names
(the launcher sets it, one GPU per worker), and writes one pickled list per group back to OUT:
the group's :class:`~foxdqn.population.jobs.Outcome` list, or the text of the error that ended the
group. While a group trains, the log lines go to the console and to every member's ``train.log``.
Exit code 0; on SIGINT/SIGTERM the group in training saves its members' weights and the worker
exits with 130/143 (foxdqn.population.train.train_population), leaving its later groups untrained.
"""
from __future__ import annotations

import logging
import pickle
import sys
import traceback
from pathlib import Path

FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's job log format


def run(groups: list, out: Path) -> None:
    """Train ``groups`` in turn; write their results to ``out`` (pickle, atomically)."""
    from foxdqn.errors import StoppedBySignal
    from foxdqn.io_atomic import write_bytes_atomic
    from foxdqn.population.train import train_population

    root = logging.getLogger()
    root.setLevel(logging.INFO)
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(console)
    results: list = []
    for group in groups:
        files = [logging.FileHandler(Path(m.run_dir) / "train.log", mode="a") for m in group]
        for f in files:
            f.setFormatter(logging.Formatter(FORMAT))
            root.addHandler(f)
        try:
            results.append(train_population(group))
        except StoppedBySignal as exc:  # the members' checkpoints are written: this worker ends with the signal's code
            print(f"foxdqn: error: {exc}", file=sys.stderr)
            sys.exit(exc.exit_code)
        except Exception:  # noqa: BLE001 - a bug: reported for the group's jobs by the launcher
            results.append(traceback.format_exc())
        finally:
            for f in files:
                root.removeHandler(f)
                f.close()
        write_bytes_atomic(out, pickle.dumps(results))


def main(argv: list[str]) -> int:
    from foxdqn.device.triton_key import start as start_triton_key

    start_triton_key()  # hashed in the background while the groups are read and built
    source, out = Path(argv[0]), Path(argv[1])
    run(pickle.loads(source.read_bytes()), out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
