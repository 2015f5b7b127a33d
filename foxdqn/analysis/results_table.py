"""The results of a run on the console: a table with the metrics as rows (it fits an 80-column
terminal) and one column per policy (agent, buy-and-hold, flat and, on a generated market, the
oracle), the agent's significance line and where the outputs are. Used by ``foxdqn.train`` and ``foxdqn.analysis.backtest``."""
from __future__ import annotations

from pathlib import Path


def print_summary(summary: dict, run_dir: Path) -> None:
    """Print ``summary`` (eval/summary.json's dict) and ``run_dir``; an episodic env's summary (no
    ``split``) is one line of its greedy-evaluation metrics."""
    from rich.console import Console
    from rich.table import Table

    if "split" not in summary:  # episodic env (CartPole, bit flipping)
        console = Console()
        m = summary["metrics"]["agent"]
        console.print(f"[bold]{summary.get('run_name', summary['experiment'])}[/bold] greedy evaluation: " +
                      ", ".join(f"{k}={v:.4g}" for k, v in m.items()), soft_wrap=True)  # one line each, for grep
        _print_trackers(console, summary)
        console.print(f"[bold]outputs:[/bold] {run_dir.resolve()}  (wall {summary['wall_time_s']} s on "
                      f"{summary['gpu'] or summary['device']})", soft_wrap=True)
        return

    name = summary.get("run_name", summary.get("experiment"))
    table = Table(title=f"{name} — {summary['split']} split, {_count(summary['bars'], 'bar')} "
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
            f"bootstrap); PSR(SR > 0) = {_psr(a['psr_vs_zero'])}; PSR(return - buy-and-hold > 0) = "
            f"{_psr(a.get('psr_vs_buy_and_hold', float('nan')))}")
    if sel:
        line += f"; selected on val {sel['metric']} = {sel['value']:.4g}"
    console.print(line, soft_wrap=True)
    gated_flat = (summary.get("gate") or {}).get("chosen") == "flat"
    if summary.get("gate"):
        console.print(gate_line(summary["gate"], summary["split"]), soft_wrap=True, highlight=False)
    if (a.get("num_trades") == 0 and not gated_flat) or sel.get("excluded"):
        console.print(_search_note(summary), soft_wrap=True, highlight=False)
    _print_trackers(console, summary)
    console.print(f"[bold]outputs:[/bold] {run_dir.resolve()}  (wall {summary['wall_time_s']} s on "
                  f"{summary['gpu'] or summary['device']})")



def _psr(value) -> str:
    """A probabilistic Sharpe ratio to 3 places, or why there is none: NaN where the returns have no
    variance (an agent that stays flat: its Sharpe ratio is undefined)."""
    return "n/a (returns without variance)" if value is None or value != value else f"{value:.3f}"


def _count(n, noun: str) -> str:
    """``n`` and ``noun``, plural unless n is 1: ``1 bar``, ``256 bars``, ``0 trades``."""
    return f"{n:g} {noun}" + ("" if n == 1 else "s")


def gate_line(gate: dict, split: str) -> str:
    """The deployment gate's line (foxdqn.analysis.gate): what it chose on validation, and the agent as
    trained on the evaluated split beside it."""
    trained = gate["candidates"][-1]
    tv, tt = trained["val"], trained[split]
    as_trained = (f"the agent as trained: {tt['total_return'] * 100:+.2f} % with "
                  f"{_count(tt['num_trades'], 'trade')} on {split}")
    if split != "val":  # an evaluation of the validation split: one figure, not the same one twice
        as_trained += f", {tv['total_return'] * 100:+.2f} % with {tv['num_trades']:g} on val"
    best = max(gate["candidates"], key=lambda c: c["val"]["total_return"])
    others = "" if len(gate["candidates"]) <= 2 or best["policy"] == "flat" else (
        f"; best on val: switch_margin={best['switch_margin']:g}, {best['val']['total_return'] * 100:+.2f} %")
    if gate["chosen"] == "flat":
        return (f"[bold]gate:[/bold] flat on the {split} split: no policy of the agent beat flat on validation with "
                f"confidence ≥ {gate['confidence']:g} (paired PSR){others}; {as_trained} (eval.gate, "
                "docs/backtest.md#the-deployment-gate)")
    return (f"[bold]gate:[/bold] the agent trades ({gate['chosen']}: it beats flat on validation with confidence ≥ "
            f"{gate['confidence']:g}){others}; {as_trained}")


def _search_note(summary: dict) -> str:
    """The line of a run that never trades (on the evaluated split, or on val where it was
    selected) or that a search does not count (``selection.excluded``)."""
    sel, trades = summary.get("selection") or {}, summary["metrics"]["agent"].get("num_trades")
    parts = []
    if trades == 0 and (summary.get("gate") or {}).get("chosen") != "flat":  # the gate's flat has its own line
        parts.append(f"the agent never trades on the {summary['split']} split (0 trades: its numbers are flat's)")
    if sel.get("excluded") == "pruned":
        parts.append(f"pruned at {summary['stop']['at_env_steps']} env steps by the search's median pruner: "
                     "not counted by the search")
    elif sel.get("excluded"):
        parts.append(f"it {sel['excluded']}: not counted by a search (search.exclude_no_trades=true)")
    return "[bold]note:[/bold] " + "; ".join(parts)


def tracker_lines(summary: dict) -> list[tuple[str, str]]:
    """(logger, text) per logger run of the summary: ``mlflow``, its run id and store with the
    command that shows it; ``wandb``, its mode, run id and folder with the command that uploads an
    offline run. A single run prints them before ``outputs:``, a population member logs them."""
    out = []
    if "mlflow" in summary:
        m = summary["mlflow"]
        out.append(("mlflow", f"run {m['run_id']} in {m['tracking_uri']}  (mlflow ui --backend-store-uri "
                              f"{m['tracking_uri']})"))
    if "wandb" in summary and summary["wandb"]["folder"]:
        w = summary["wandb"]
        how = f"  (upload: wandb sync {w['folder']})" if w["mode"] == "offline" else ""
        out.append(("wandb", f"{w['mode']} run {w['run_id']} in {w['folder']}{how}"))
    return out


def _print_trackers(console, summary: dict) -> None:
    """:func:`tracker_lines`, printed just before ``outputs:``."""
    for name, text in tracker_lines(summary):
        console.print(f"[bold]{name}:[/bold] {text}", soft_wrap=True, highlight=False)
