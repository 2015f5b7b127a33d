"""``python -m foxdqn.evaluate checkpoint=PATH [split=val|test|train] [out=DIR] [overrides]``.

Evaluates the online weights of a checkpoint (foxdqn.run.checkpoint) with the code a training run uses
(:func:`foxdqn.analysis.backtest.evaluate` and :func:`foxdqn.analysis.backtest.write_report`; greedy episodes for
episodic envs) on any split of the run's data or of another file, and writes into its own folder
(default ``<run>/evaluations/<checkpoint stem>_<split>[_<override>...]`` for a checkpoint in the
``checkpoints/`` of the run that wrote it (the run id of its ``config.yaml``); for any other
checkpoint ``evaluations/`` beside the checkpoint file, never another run's folder; ``data.path``
given as its file stem, so evaluations with other data or costs never overwrite each other):

* ``summary.json``, ``equity.csv``, ``equity.png`` (equity curves and the agent's drawdown), as a
  run's ``eval/``;
* ``trades.csv``: one row per fill of the agent: ``timestamp`` (the bar the order executed in),
  ``action`` (its label), ``order_type``, ``fill_price`` (price units), ``fee`` (cash units,
  negative = rebate), ``position`` (exposure held after the fill, fraction of equity) and
  ``equity`` (cash units, at that bar's close).

The config is the checkpoint's. Overrides may change only what is evaluated, not the agent:
``data.*`` (another file: its own training-split statistics normalise its features), ``eval.*``,
``env.execution.*`` (other costs), ``device``, ``seed``, ``debug.max_eval_bars`` (a ``debug=smoke``
checkpoint walks 256 bars; ``debug.max_eval_bars=null`` the whole split). Bad input (a missing or
foreign checkpoint, another key, a network that does not fit the data) ends with one line on
stderr and exit code 2.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from foxdqn.errors import ConfigError, FoxdqnError

# foxdqn's other modules are imported inside the functions that need them (start-up: ``--help``
# answers with a few modules of the standard library, a malformed argument without torch).

ALLOWED = ("data.", "eval.", "env.execution.", "device=", "seed=", "debug.max_eval_bars=")
USAGE = ("usage: python -m foxdqn.evaluate checkpoint=PATH [split=val|test|train] [out=DIR] "
         "[data.path=FILE | data.name=NAME] [eval.*=...] [env.execution.*=...] [device=cpu|cuda] "
         "[debug.max_eval_bars=N|null]")


def parse_args(argv: list[str]) -> tuple[Path, str | None, Path | None, list[str]]:
    """``(checkpoint, split, out, overrides)`` from ``key=value`` arguments.

    Raises:
        ConfigError: no ``checkpoint=``, an argument that is not ``key=value``, or a key outside
            :data:`ALLOWED`.
    """
    checkpoint, split, out, overrides = None, None, None, []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            raise ConfigError(f"argument {arg!r} is not key=value; {USAGE}")
        if key == "checkpoint":  # a run folder means its checkpoints/last.pt, as resume=RUN does
            from foxdqn.run.resume import resume_path  # start-up: torch (the comment above ALLOWED)

            checkpoint = resume_path(value, key)
        elif key == "split":
            split = value
        elif key == "out":
            out = Path(value).expanduser()
        elif any(arg.startswith(prefix) for prefix in ALLOWED):
            overrides.append(arg)
        else:
            raise ConfigError(f"{key}: not an evaluation setting (allowed: checkpoint, split, out, data.*, eval.*, "
                              "env.execution.*, device, seed, debug.max_eval_bars); the agent's own settings come "
                              "from the checkpoint")
    if checkpoint is None:
        raise ConfigError(f"checkpoint=PATH is required; {USAGE}")
    return checkpoint, split, out, overrides


def config_from(payload: dict, overrides: list[str]):
    """The checkpoint's :class:`~foxdqn.config.schema.TrainConfig` with ``overrides`` applied, validated."""
    from omegaconf import OmegaConf

    from foxdqn.config.schema import TrainConfig, composition_error, to_object, validate  # start-up: torch

    try:
        cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.create(payload["config"]),
                              OmegaConf.from_dotlist(overrides))
    except Exception as exc:  # noqa: BLE001 - omegaconf: unknown key, wrong type
        raise ConfigError(f"override: {composition_error(exc)}") from None
    tc = to_object(cfg)
    tc.resume = None
    validate(tc)
    return tc


def evaluate_checkpoint(checkpoint: Path, split: str | None = None, out: Path | None = None,
                        overrides: list[str] = ()) -> tuple[dict, Path]:
    """Evaluate ``checkpoint`` on ``split`` (default: the run's ``eval.split``; a trading run's only:
    an episodic env has no splits); returns ``(summary, folder)``.

    Raises:
        ConfigError / DataError: a bad checkpoint, override, split (any given for an episodic env)
            or data file.
    """
    import torch

    # start-up: torch and the modules that import it, and the file writers (the comment above ALLOWED)
    from foxdqn.run.checkpoint import load_checkpoint
    from foxdqn.data import load_market_data
    from foxdqn.analysis.backtest import evaluate, evaluate_episodes, write_report
    from foxdqn.io_atomic import write_json_atomic
    from foxdqn.step.build import build_action_mode, build_env, build_network, resolve_device

    t0 = time.perf_counter()
    payload = load_checkpoint(checkpoint)
    cfg = config_from(payload, list(overrides))
    if split is not None and cfg.env.name != "trading":
        raise ConfigError(f"split={split}: the {cfg.env.name} env of this run has no data splits (its episodes are "
                          "simulated); evaluate it without split=")
    split = split or cfg.eval.split
    if split not in ("train", "val", "test"):
        raise ConfigError(f"split={split!r} is not allowed; choose one of train, val, test")
    device = resolve_device(cfg.device)
    market = load_market_data(cfg.data, cfg.env.window, cfg.env.episode_length) if cfg.env.name == "trading" else None
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed)
    env = build_env(cfg, market, "train", device, gen)
    mode = build_action_mode(cfg, env)
    online = build_network(cfg, env, mode.num_actions).to(device)
    try:
        online.load_state_dict(payload["online"])
    except RuntimeError as exc:
        raise ConfigError(f"checkpoint {checkpoint}: its network does not fit this data "
                          f"({str(exc).splitlines()[1].strip() if len(str(exc).splitlines()) > 1 else exc})") from None
    env.close()
    folder = out or free_folder(evaluations_folder(checkpoint, payload), folder_name(checkpoint, split, overrides),
                                checkpoint, list(overrides))
    extra = {"checkpoint": str(checkpoint.resolve()), "checkpoint_env_steps": payload.get("env_steps"),
             "overrides": list(overrides), "experiment": cfg.experiment, "run_name": trained_name(payload, cfg),
             "data": market.source if market is not None else None, "device": str(device),
             "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
             "wall_time_s": round(time.perf_counter() - t0, 2), "torch": torch.__version__}
    if market is None:
        summary = {**extra, "env": cfg.env.name,
                   "metrics": {"agent": evaluate_episodes(cfg, online, mode, device, episodes=cfg.eval.episodes)}}
        write_json_atomic(folder / "summary.json", summary)
        return summary, folder
    from foxdqn.analysis.gate import gate_enabled, gated_agents

    if gate_enabled(cfg):  # the deployment gate the run was evaluated behind (foxdqn.analysis.gate)
        from foxdqn.analysis.backtest import POLICIES

        results, gates = gated_agents(cfg, market, online, device, 1, split, mode, POLICIES)
        result, extra["gate"] = results[0], gates[0]
    else:
        result = evaluate(cfg, market, online, device, split=split, action_mode=mode)
    data_name = cfg.data.name if cfg.data.path is None else Path(cfg.data.path).name
    extra["out_of_sample"] = out_of_sample(cfg, market, split, config_from(payload, []))
    summary = write_report(folder, result, market, split, f"{extra['run_name']}: {data_name}, {split} split "
                           f"({checkpoint.name})", extra)
    write_trades(folder / "trades.csv", result["curves"]["agent"], market)
    return summary, folder


def out_of_sample(cfg, market, split: str, trained) -> bool:
    """Whether the bars an evaluation of ``split`` walks (``cfg``'s data, ``market``) are none the run
    saw: its training split (it trained on it) and its validation split (it chose its checkpoint on
    it: ``best.pt``, early stopping, the deployment gate) precede its test split, so a walk of the
    same bars (the same file or generator: ``data.name``, ``data.path``, ``data.synthetic``) is out of
    sample when it starts at or after the first bar of the run's own test split (``trained``: the
    run's config; another ``data.split`` moves the splits, not the bars the run saw); other bars
    always are."""
    from foxdqn.config.schema import to_plain  # start-up: torch (the comment above ALLOWED)
    from foxdqn.data import load_market_data
    from foxdqn.envs.trading import walk_bounds

    mine, theirs = to_plain(cfg.data), to_plain(trained.data)
    if any(mine[k] != theirs[k] for k in ("name", "path", "synthetic")):
        return True
    seen = market if mine == theirs else load_market_data(trained.data, trained.env.window, trained.env.episode_length)
    unseen_from = int(seen.splits["val"][1])  # the first bar after the run's validation split
    if unseen_from >= len(seen.timestamps):
        return False
    first = walk_bounds(market, split, cfg.env.window, cfg.debug.max_eval_bars)[0]
    return bool(market.timestamps[first] >= seen.timestamps[unseen_from])


def evaluations_folder(checkpoint: Path, payload: dict) -> Path:
    """``<run>/evaluations`` when ``checkpoint`` lies in ``<run>/checkpoints/`` and ``<run>``'s start
    record names the run that wrote it (the same run id; or neither has one: a folder of a foxdqn
    before run ids); else ``evaluations/`` beside
    the file."""
    from foxdqn.run.folder import read_record  # start-up (the comment above ALLOWED)

    path = checkpoint.resolve()
    run_dir = path.parent.parent
    if path.parent.name == "checkpoints":
        try:
            record = read_record(run_dir)
        except ConfigError:
            record = None
        if (record[0] if record is not None else None) == payload.get("run_id"):
            return run_dir / "evaluations"
    return path.parent / "evaluations"


def trained_name(payload: dict, cfg) -> str:
    """The name of the run that wrote the checkpoint (:func:`foxdqn.config.schema.run_name` of its own
    config: an evaluation on other data is still titled after the run it evaluates)."""
    from foxdqn.config.schema import run_name  # start-up: torch (the comment above ALLOWED)

    trained = payload.get("config") or {}
    return run_name(cfg.experiment, (trained.get("data") or {}).get("path", cfg.data.path),
                    (trained.get("env") or {}).get("id", cfg.env.id))


def folder_name(checkpoint: Path, split: str, overrides) -> str:
    """``<checkpoint stem>_<split>`` plus each override (``data.path`` as its file stem), so that
    evaluations with other data or costs never overwrite each other."""
    import re

    parts = [checkpoint.stem, split]
    for item in overrides:
        key, _, value = item.partition("=")
        parts.append(Path(value).stem if key == "data.path" else f"{key.split('.')[-1]}={value}")
    return re.sub(r"[^A-Za-z0-9._=-]", "_", "_".join(parts))


def free_folder(parent: Path, name: str, checkpoint: Path, overrides: list[str]) -> Path:
    """``parent/name``, unless it holds an evaluation of another checkpoint or other overrides (a
    name keeps each key's last part: ``seed=5`` and ``data.synthetic.seed=5`` are both ``seed=5``):
    then ``name_2``, ``name_3``, ... the first free one or one of the same evaluation (evaluated again:
    replaced)."""
    import json

    for k in range(1, 10_000):
        folder = parent / (name if k == 1 else f"{name}_{k}")
        try:
            done = json.loads((folder / "summary.json").read_text())
        except (OSError, ValueError):
            return folder  # free (or holding no readable evaluation: written over, as before)
        if done.get("checkpoint") == str(checkpoint.resolve()) and sorted(done.get("overrides") or []) == sorted(overrides):
            return folder
    raise ConfigError(f"{parent}: 9,999 evaluations named {name}_*; give out=DIR")


def write_trades(path: Path, walk: dict, market) -> None:
    """``trades.csv`` of one evaluation walk (see the module docstring), atomically."""
    import numpy as np
    import pandas as pd

    from foxdqn.execution.orders import ORDER_TYPES, action_name  # start-up: torch (the comment above ALLOWED)
    from foxdqn.io_atomic import write_text_atomic  # start-up (the comment above ALLOWED)

    fills = np.flatnonzero(walk["fills"])
    bars = walk["index"][fills + 1]  # equity point i+1 is the close of the bar the step-i order executed in
    table = pd.DataFrame({
        "timestamp": market.timestamps[bars].astype(str),
        "action": [action_name(int(a)) for a in walk["actions"][fills]],
        "order_type": [ORDER_TYPES[(int(a) // 3) % 3] for a in walk["actions"][fills]],
        "fill_price": walk["fill_price"][fills],
        "fee": walk["fees"][fills],
        "position": walk["exposure"][fills],
        "equity": walk["equity"][fills + 1],
    })
    write_text_atomic(path, table.to_csv(index=False))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        if argv:
            print(__doc__)
            return 0
        print(f"foxdqn: error: {USAGE}", file=sys.stderr)
        return 2
    try:
        checkpoint, split, out, overrides = parse_args(argv)
        summary, folder = evaluate_checkpoint(checkpoint, split, out, overrides)
    except FoxdqnError as exc:
        print(f"foxdqn: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # out= under a file, unwritable, disk full
        print(f"foxdqn: error: writing the evaluation failed: {exc.filename or ''} {exc.strerror or exc}".strip(),
              file=sys.stderr)
        return 2
    from foxdqn.analysis.results_table import print_summary  # start-up (the comment above ALLOWED)

    print_summary({**summary, "selection": {}}, folder)
    if summary.get("out_of_sample") is False:
        print(f"foxdqn: warning: split={summary['split']} walks bars the run trained or chose its checkpoint on "
              "(its train and val splits): this result is not out of sample (its test split is)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
