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
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("object_type", "Set the environment variable"))]
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


def _precheck(argv: list[str]) -> None:
    """Validate config and data before Hydra creates a run folder (single runs)."""
    overrides = _overrides(argv)
    if overrides is None:
        return
    from foxdqn.data import load_market_data

    try:
        cfg = load_config(overrides)
        if cfg.env.name == "trading":
            load_market_data(cfg.data, cfg.env.window, cfg.env.episode_length)
    except FoxdqnError as exc:
        _fail(str(exc))


def _print_summary(summary: dict, run_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    if "split" not in summary:  # episodic env (CartPole, bit flipping)
        console = Console()
        m = summary["metrics"]["agent"]
        console.print(f"[bold]{summary['experiment']}[/bold] greedy evaluation: " +
                      ", ".join(f"{k}={v:.4g}" for k, v in m.items()))
        console.print(f"[bold]outputs:[/bold] {run_dir.resolve()}  (wall {summary['wall_time_s']} s on "
                      f"{summary['gpu'] or summary['device']})")
        return

    table = Table(title=f"{summary.get('experiment')} — {summary['split']} split, {summary['bars']} bars "
                        f"({summary['period'][0]} → {summary['period'][1]})")
    cols = ["total_return", "sharpe", "sortino", "max_drawdown", "profit_factor", "hit_rate", "turnover",
            "num_trades"]
    console = Console(width=max(Console().width, 130))
    table.add_column("policy")
    for c in cols:
        table.add_column(c, justify="right")
    for name, m in summary["metrics"].items():
        table.add_row(name, *[f"{m[c]:.4g}" if isinstance(m.get(c), (int, float)) else str(m.get(c)) for c in cols])
    console.print(table)
    console.print(f"[bold]outputs:[/bold] {run_dir.resolve()}  (wall {summary['wall_time_s']} s on "
                  f"{summary['gpu'] or summary['device']})")


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def _run(cfg: DictConfig) -> float:
    from foxdqn.data import load_market_data
    from foxdqn.io_atomic import write_text_atomic
    from foxdqn.loop import train

    try:
        tc = finalize(cfg)
        market = load_market_data(tc.data, tc.env.window, tc.env.episode_length) if tc.env.name == "trading" else None
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        write_text_atomic(run_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.structured(tc)))
        summary = train(tc, market, run_dir)
    except FoxdqnError as exc:
        _fail(str(exc))
    except HaltError as exc:
        _fail(f"training halted: {exc}", code=HaltError.exit_code)
    _print_summary(summary, run_dir)
    agent = summary["metrics"]["agent"]
    return float(agent.get("sharpe", agent.get("mean_return", float("nan"))))


def main() -> None:
    _precheck(sys.argv[1:])
    _run()


if __name__ == "__main__":
    main()
