"""``python -m foxdqn.train [+experiment=NAME] [overrides] [--multirun ...]``.

Composes ``conf/train.yaml`` (inside the package) with Hydra, validates the config and the data
before any output folder is made, trains, evaluates on the test split and prints where the
outputs are. Bad input (an unknown key, a wrong type, an invalid value, a bad data file) ends with
one line on stderr and exit code 2; a halt raised by an on-device guard ends with exit code 3
after the last good weights are saved.
"""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from foxdqn.config import TrainConfig, finalize
from foxdqn.errors import FoxdqnError, HaltError

_FLAGS_WITH_VALUE = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
                     "--experimental-rerun", "--package", "-p", "--info", "-i"}


def _fail(message: str, code: int = 2) -> None:
    print(f"foxdqn: error: {message}", file=sys.stderr)
    sys.exit(code)


def _one_line(exc: BaseException) -> str:
    """One line from a Hydra/OmegaConf composition error: the message, the underlying cause
    (e.g. the expected type) and, for an unknown key, the keys allowed there."""
    import re

    from foxdqn.config import unknown_key_message

    text = str(exc).strip() or type(exc).__name__
    unknown = re.search(r"Could not override '([^']+)'", text)
    if unknown:
        return unknown_key_message(unknown.group(1))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    cut = next((i for i, ln in enumerate(lines) if ln.startswith("Config search path")), len(lines))
    keep = [ln for ln in lines[:cut] if not ln.startswith(("object_type", "Set the environment variable"))]
    if any(ln.startswith("Available options") for ln in keep):  # "...in 'head':" + one option per line
        i = next(i for i, ln in enumerate(keep) if ln.startswith("Available options"))
        keep = keep[:i] + [keep[i] + " " + ", ".join(keep[i + 1:])]
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause).strip():
        first = str(cause).strip().splitlines()[0].strip()
        if first not in keep:
            keep.append(first)
    return "; ".join(keep) or text


def _overrides(argv: list[str]) -> list[str] | None:
    """The plain overrides of a single run (None for multirun or informational invocations)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("-m", "--multirun", "--help", "-h", "--hydra-help", "--cfg", "-c", "--version",
                   "--shell-completion", "-sc", "--resolve", "--info", "-i"):
            return None
        if arg in _FLAGS_WITH_VALUE:
            skip = True
            continue
        if arg.startswith("-"):
            continue
        if not arg.lstrip("+~").startswith(("hydra.", "hydra/")):
            out.append(arg)
    return out


def load_config(overrides: list[str]) -> TrainConfig:
    """Compose ``train.yaml`` with ``overrides`` and finalize it (used by tests and the precheck).

    Raises FoxdqnError (ConfigError) for any composition or validation problem.
    """
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from foxdqn.errors import ConfigError

    GlobalHydra.instance().clear()
    try:
        with initialize_config_module("foxdqn.conf", version_base="1.3"):
            cfg = compose("train", overrides=overrides)
    except FoxdqnError:
        raise
    except Exception as exc:  # hydra / omegaconf errors: unknown key, wrong type, missing option
        raise ConfigError(_one_line(exc)) from None
    finally:
        GlobalHydra.instance().clear()
    return finalize(cfg)


def _sweep_jobs(argv: list[str]) -> list[list[str]] | None:
    """The override lists of a ``--multirun`` sweep (basic sweeper syntax: ``a=1,2 b=x,y``), or
    None when they cannot be expanded here (another sweeper, ranges, ...)."""
    args = [a for a in argv if a not in ("-m", "--multirun")]
    plain = _overrides(args)
    if plain is None:
        return None
    try:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parsed = OverridesParser.create().parse_overrides(plain)
        batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
        return [list(job) for batch in batches for job in batch]
    except Exception:  # noqa: BLE001 - fall back to per-job checks inside the run
        return None


def _available_bytes(device: str) -> int | None:
    """Free memory of the run's device (CUDA: free GPU memory; CPU: MemAvailable on Linux)."""
    import torch

    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return int(torch.cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _check(overrides: list[str]) -> None:
    from foxdqn.errors import ConfigError
    from foxdqn.replay.buffer import replay_bytes

    cfg = load_config(overrides)
    if cfg.resume not in (None, "auto"):  # a bad checkpoint is refused before Hydra makes a run folder
        from foxdqn.resume import read_checkpoint, resume_path

        read_checkpoint(resume_path(cfg.resume))
    market = _market(cfg)
    itemsize = 4
    if cfg.env.name == "gym":  # unknown id / non-Discrete actions fail here, before any run folder
        import math

        from foxdqn.envs.gym_adapter import describe

        from foxdqn.step.build import check_encoder

        spaces = describe(cfg.env)
        check_encoder(cfg.model.encoder, spaces["obs_shape"], cfg.env.id)
        obs_dim, itemsize = math.prod(spaces["obs_shape"]), spaces["obs_dtype"].itemsize
    else:
        obs_dim = {"trading": cfg.env.window * (market.features.shape[1] if market else 5) + 2, "cartpole": 4,
                   "bitflip": 2 * cfg.env.n_bits}[cfg.env.name]
    need, free = replay_bytes(cfg.replay.capacity, obs_dim, itemsize, cfg.regime.enabled), _available_bytes(cfg.device)
    if free is not None and need > 0.8 * free:
        raise ConfigError(f"replay.capacity={cfg.replay.capacity} needs {need / 2**30:.1f} GiB for observations "
                          f"of size {obs_dim}, more than the {free / 2**30:.1f} GiB free; lower replay.capacity")


def _precheck(argv: list[str]) -> None:
    """Validate config and data before Hydra creates a run folder: the single run, or every job
    of a ``--multirun`` sweep."""
    if "-m" in argv or "--multirun" in argv:
        jobs = _sweep_jobs(argv) or []
    else:
        single = _overrides(argv)
        jobs = [] if single is None else [single]
    for job in jobs:
        try:
            _check(job)
        except FoxdqnError as exc:
            prefix = f"job {' '.join(job)}: " if len(jobs) > 1 else ""
            _fail(prefix + str(exc))
    _check_output_parent(argv)


def _check_output_parent(argv: list[str]) -> None:
    """Before Hydra makes the run (or sweep) folder: its nearest existing ancestor must be a
    writable folder, else one line naming the path and exit 2 (Hydra would fail with a traceback)."""
    import os

    key = "hydra.sweep.dir=" if ("-m" in argv or "--multirun" in argv) else "hydra.run.dir="
    given = [a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith(key)]
    target = Path(given[-1] if given else "outputs").expanduser().absolute()
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        _fail(f"output folder {target}: {probe} is a file, not a folder; choose another {key[:-1]}")
    if not os.access(probe, os.W_OK | os.X_OK):
        _fail(f"output folder {target}: {probe} is not writable; choose another {key[:-1]}")


def _print_summary(summary: dict, run_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    if "split" not in summary:  # episodic env (CartPole, bit flipping)
        console = Console()
        m = summary["metrics"]["agent"]
        console.print(f"[bold]{summary.get('run_name', summary['experiment'])}[/bold] greedy evaluation: " +
                      ", ".join(f"{k}={v:.4g}" for k, v in m.items()), soft_wrap=True)  # one line each, for grep
        console.print(f"[bold]outputs:[/bold] {run_dir.resolve()}  (wall {summary['wall_time_s']} s on "
                      f"{summary['gpu'] or summary['device']})", soft_wrap=True)
        return

    name = summary.get("run_name", summary.get("experiment"))
    table = Table(title=f"{name} — {summary['split']} split, {summary['bars']} bars "
                        f"({summary['period'][0]} → {summary['period'][1]})")
    rows = {"total_return": "total return", "sharpe": "Sharpe (annualised)", "sortino": "Sortino (annualised)",
            "max_drawdown": "max drawdown", "profit_factor": "profit factor", "hit_rate": "hit rate",
            "turnover": "turnover (x equity/yr)", "num_trades": "trades"}
    probe = Console()
    console = Console(width=probe.width if probe.is_terminal else 130)  # a terminal's width; files: no wrapping
    table.add_column("metric")  # metrics as rows: fits an 80-column terminal
    for name in summary["metrics"]:
        table.add_column(name, justify="right")
    for key, label in rows.items():
        table.add_row(label, *[f"{m[key]:.4g}" if isinstance(m.get(key), (int, float)) else str(m.get(key))
                               for m in summary["metrics"].values()])
    console.print(table)
    a, sel = summary["metrics"]["agent"], summary.get("selection") or {}
    line = (f"agent Sharpe 95 % interval [{a['sharpe_ci95_low']:.3g}, {a['sharpe_ci95_high']:.3g}] (block "
            f"bootstrap); PSR(SR > 0) = {a['psr_vs_zero']:.3f}; PSR(return - buy-and-hold > 0) = "
            f"{a.get('psr_vs_buy_and_hold', float('nan')):.3f}")
    if sel:
        line += f"; selected on val {sel['metric']} = {sel['value']:.4g}"
    console.print(line, soft_wrap=True)
    console.print(f"[bold]outputs:[/bold] {run_dir.resolve()}  (wall {summary['wall_time_s']} s on "
                  f"{summary['gpu'] or summary['device']})")


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def _run(cfg: DictConfig) -> float:
    from foxdqn.io_atomic import write_text_atomic
    from foxdqn.loop import Interrupted, train
    from foxdqn.resume import resolve_resume
    from foxdqn.run_folder import RunFolder

    folder = None
    try:
        tc = finalize(cfg)
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        payload = None
        if tc.resume is not None:
            tc, run_dir, payload = resolve_resume(tc, run_dir)
        market = _market(tc)
        folder = RunFolder(run_dir).open(resume=tc.resume is not None)
        write_text_atomic(run_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.structured(tc)))
        summary = train(tc, market, run_dir, resume=payload)
    except FoxdqnError as exc:
        _release(folder)
        return _job_failed(str(exc), 2)
    except HaltError as exc:
        _release(folder, finished=True)  # HALTED marks the end
        return _job_failed(f"training halted: {exc}", HaltError.exit_code)
    except Interrupted as exc:
        _release(folder)  # INCOMPLETE stays: resume=auto continues
        _fail(str(exc), code=exc.exit_code)
    except OSError as exc:  # the output folder failed under the run (disk full, removed, read-only)
        _release(folder)
        _fail(f"writing the run's outputs failed: {exc.filename or ''} {exc.strerror or exc}".strip())
    except (MemoryError, RuntimeError) as exc:  # allocation failures: a size setting is too large
        _release(folder)
        if isinstance(exc, MemoryError) or "allocate" in str(exc) or "out of memory" in str(exc):
            _fail("out of memory building the run: reduce replay.capacity, env.num_envs, model.hidden or "
                  f"agent.batch_size ({str(exc).splitlines()[0][:120]})")
        raise
    folder.finish()
    _print_summary(summary, run_dir)
    return objective(summary)


#: (exit code, message) of the jobs of this process's multirun that failed; main() exits with the worst.
_FAILED_JOBS: list[tuple[int, str]] = []


def _job_failed(message: str, code: int) -> float:
    """A single run ends here (one line, exit ``code``); a multirun job reports it, returns NaN to
    the sweeper and lets the other jobs run (main() exits with ``code`` at the end)."""
    from hydra.types import RunMode

    if HydraConfig.get().mode != RunMode.MULTIRUN:
        _fail(message, code)
    job = HydraConfig.get().job.num
    print(f"foxdqn: error: job {job}: {message}", file=sys.stderr)
    _FAILED_JOBS.append((code, f"job {job}: {message}"))
    return float("nan")


def _release(folder, finished: bool = False) -> None:
    if folder is not None:
        folder.finish() if finished else folder.release()


def _market(tc: TrainConfig):
    """The run's market data, loaded once per process and data setting (the precheck and the run
    share it)."""
    if tc.env.name != "trading":
        return None
    from foxdqn.data import load_market_data

    key = (repr(tc.data), tc.env.window, tc.env.episode_length)
    if key not in _MARKETS:
        _MARKETS.clear()  # one dataset at a time: a sweep over files does not pile them up
        _MARKETS[key] = load_market_data(tc.data, tc.env.window, tc.env.episode_length)
    return _MARKETS[key]


_MARKETS: dict = {}
def objective(summary: dict) -> float:
    """The value a run returns to a Hydra sweeper (Optuna, ...): the validation metric of the weights
    the run kept (``summary["selection"]``, docs/backtest.md), never a test-split number."""
    return float(summary["selection"]["value"])


def _outside_training(signum, frame) -> None:
    """SIGINT/SIGTERM outside the training loop (start-up, evaluation): one line, exit 128 + signal;
    the training loop installs its own handlers (stop after the iteration, with a checkpoint)."""
    import signal

    _fail(f"interrupted by {signal.Signals(signum).name} outside training; checkpoints already written are kept",
          128 + signum)


def main() -> None:
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _outside_training)
    _precheck(sys.argv[1:])
    _run()
    if _FAILED_JOBS:  # a multirun whose jobs did not all finish
        print(f"foxdqn: error: {len(_FAILED_JOBS)} job(s) of the multirun failed (see above and seeds.md)",
              file=sys.stderr)
        sys.exit(max(code for code, _ in _FAILED_JOBS))


if __name__ == "__main__":
    main()
