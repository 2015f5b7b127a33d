"""Ensemble rules compared on trained populations: the same members, walked as one agent by each rule.

Usage::

    python -m bench.ensemble_rules SWEEP [SWEEP ...] [--rules mean,consensus:0.8,lcb:1] [--split test]
                                   [--out FILE.md]

Each SWEEP is the folder of a multirun whose jobs trained as one population (``hydra/launcher=population``,
one setting, e.g. a ``bench.learnability`` market folder). The members' final weights are read
from their ``checkpoints/last.pt`` (:func:`foxdqn.run.checkpoint.load_checkpoint`), stacked into
one member network (:func:`foxdqn.population.state.member_network`), and for every rule of ``--rules``
(``RULE`` or ``RULE:VALUE``: ``consensus:A`` sets ``eval.ensemble_agreement`` = A, ``lcb:K``
``eval.ensemble_kappa`` = K) the ensemble (:class:`foxdqn.population.ensemble.EnsembleGreedy`)
is walked on ``--split`` by :func:`foxdqn.analysis.backtest.evaluate_agents`, the walk a
population's ``ensemble_policy`` entry comes from, on the device of the members' config. Printed
(and with ``--out`` written as markdown): per sweep, the data and its oracle's test return, and per
rule the ensemble's total return (percent) and number of trades. No training: rules are compared
on the same members, so their differences are the rules' alone. docs/bench.md#learnability.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DEFAULT_RULES = "mean,vote,consensus:0.6,consensus:0.8,consensus:1,lcb:0.5,lcb:1,lcb:1.5"


def parse_rules(text: str) -> list[tuple[str, float | None]]:
    """``"mean,lcb:1"`` → ``[("mean", None), ("lcb", 1.0)]``.

    Raises:
        ValueError: an unknown rule, or a value that is not a number.
    """
    from foxdqn.population.ensemble import RULES

    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, value = item.partition(":")
        if name not in RULES:
            raise ValueError(f"--rules: {name!r} is not an ensemble rule; choose from {', '.join(RULES)}")
        try:
            out.append((name, float(value) if value else None))
        except ValueError:
            raise ValueError(f"--rules: {item!r}: the value after ':' must be a number") from None
    return out


def compare(sweep: Path, rules: list[tuple[str, float | None]], split: str = "test") -> dict:
    """``{"sweep", "data", "members", "oracle", "rules": {label: (total_return, trades)}}`` of the
    population trained in ``sweep`` (module docstring). Returns are fractions.

    Raises:
        FileNotFoundError: ``sweep`` holds fewer than two ``*/checkpoints/last.pt``.
    """
    import torch

    from foxdqn.actions.switch import action_exposures
    from foxdqn.analysis.backtest import evaluate_agents
    from foxdqn.data import load_market_data
    from foxdqn.evaluate import config_from
    from foxdqn.population.ensemble import EnsembleGreedy
    from foxdqn.population.state import member_network
    from foxdqn.run.checkpoint import load_checkpoint
    from foxdqn.step.build import build_action_mode, build_env, build_network, resolve_device

    paths = sorted(sweep.glob("*/checkpoints/last.pt"))
    if len(paths) < 2:
        raise FileNotFoundError(f"{sweep}: an ensemble needs two or more */checkpoints/last.pt, found {len(paths)}")
    payloads = [load_checkpoint(p) for p in paths]
    cfg = config_from(payloads[0], [])
    device = resolve_device(cfg.device)
    market = load_market_data(cfg.data, cfg.env.window, cfg.env.episode_length)
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed)
    env = build_env(cfg, market, "train", device, gen)
    mode = build_action_mode(cfg, env)
    nets = []
    for payload in payloads:
        net = build_network(cfg, env, mode.num_actions)
        net.load_state_dict(payload["online"])
        nets.append(net)
    env.close()
    online = member_network(nets, str(cfg.model.activation)).to(device)  # C51, IQN, branching: their member class
    exposures = action_exposures(None if mode is None else mode.name, device)
    members = list(range(len(nets)))
    seed = re.search(r"\bseed=(\d+)", market.source)  # a generated market names its seed in its source
    data = market.source.split(" (")[0] + (f", seed {seed.group(1)}" if seed else "")
    out = {"sweep": str(sweep), "data": data, "members": len(nets), "oracle": None, "rules": {}}
    for name, value in rules:
        agreement = value if name == "consensus" and value is not None else float(cfg.eval.ensemble_agreement)
        kappa = value if name == "lcb" and value is not None else float(cfg.eval.ensemble_kappa)
        greedy = EnsembleGreedy(online, members, name, agreement, exposures, kappa)
        result = evaluate_agents(cfg, market, greedy, device, 1, split, mode, ("agent", "oracle"))[0]["metrics"]
        label = name if name in ("mean", "vote") else f"{name} {agreement if name == 'consensus' else kappa:g}"
        out["rules"][label] = (result["agent"]["total_return"], int(result["agent"]["num_trades"]))
        if "oracle" in result:
            out["oracle"] = result["oracle"]["total_return"]
    return out


def markdown(rows: list[dict]) -> str:
    """One row per sweep, one column per rule: total return (percent) and trades."""
    labels = list(dict.fromkeys(label for row in rows for label in row["rules"]))
    pct = lambda v: "—" if v is None else f"{v * 100:+.2f} %"  # noqa: E731
    lines = ["| sweep | data | members | oracle | " + " | ".join(labels) + " |",
             "|---|---|---|---|" + "---|" * len(labels)]
    for row in rows:
        cells = [f"{pct(row['rules'][k][0])} ({row['rules'][k][1]})" if k in row["rules"] else "—" for k in labels]
        lines.append(f"| {Path(row['sweep']).name} | {row['data']} | {row['members']} | {pct(row['oracle'])} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ensemble_rules", description=__doc__.splitlines()[0])
    p.add_argument("sweeps", nargs="+", type=Path)
    p.add_argument("--rules", default=DEFAULT_RULES)
    p.add_argument("--split", default="test", choices=("train", "val", "test"))
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    try:
        rules = parse_rules(args.rules)
    except ValueError as exc:
        print(f"bench.ensemble_rules: error: {exc}", file=sys.stderr)
        return 2
    rows = []
    for sweep in args.sweeps:
        try:
            rows.append(compare(sweep, rules, args.split))
        except FileNotFoundError as exc:
            print(f"bench.ensemble_rules: error: {exc}", file=sys.stderr)
            return 2
        print(markdown(rows[-1:]), flush=True)
    if args.out:
        from foxdqn.io_atomic import write_text_atomic

        write_text_atomic(args.out, markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
