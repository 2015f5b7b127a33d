"""Metrics to Weights & Biases (``logger=wandb``; the optional extra ``foxdqn[wandb]``), the logger
CleanRL's ``--track`` and rl-baselines3-zoo users expect.

One W&B run per foxdqn run, in the project ``logger.wandb_project`` (default ``foxdqn``), named
after the foxdqn run and grouped by sweep folder in a ``--multirun``: at start the run's resolved
config (nested, as W&B shows groups); at every log boundary the numbers of the row, at
``step`` = env steps; at the end the evaluated split's agent metrics and the validation selection
(in the run's summary and logged at the last step) and ``eval/equity.png`` as an image; then the
run's end, with exit code 1 after a guard halt or a failure and 128 + the signal after SIGINT or
SIGTERM (W&B marks those runs crashed).

``logger.wandb_mode`` is ``offline`` by default: nothing leaves the machine, and tests need no
network. The run is written under ``<run>/wandb/offline-run-<date>-<id>/``; ``wandb sync
<that folder>`` uploads it later. ``online`` needs a W&B login (``wandb login`` or
``WANDB_API_KEY``), ``disabled`` turns W&B off. The run id is kept in ``<run>/wandb_run_id``, so a
resumed run (``resume=auto``) continues the same W&B run (``resume="allow"``); W&B ignores rows
at steps below the ones it already has, which a resumed run logs again after its checkpoint.
"""
from __future__ import annotations

import logging
import math
import numbers
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from foxdqn.io_atomic import write_text_atomic

RUN_ID_FILE = "wandb_run_id"
log = logging.getLogger(__name__)


def check(mode: str) -> None:
    """Raises ImportError (naming the extra) when wandb is absent, PermissionError when
    ``mode`` is ``online`` and no W&B login is found (``WANDB_API_KEY``, or ``api.wandb.ai`` in
    ``~/.netrc``, where ``wandb login`` writes it)."""
    try:
        import wandb  # noqa: F401
    except ImportError as exc:
        raise ImportError("logger=wandb needs wandb: pip install 'foxdqn[wandb]' (or pip install wandb)") from exc
    if mode == "online" and not os.environ.get("WANDB_API_KEY"):
        netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
        if not (netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="replace")):
            raise PermissionError("logger.wandb_mode=online needs a W&B login (wandb login, or WANDB_API_KEY); "
                                  "offline runs (the default) upload later with wandb sync")


class WandbLogger:
    """Log foxdqn rows to one W&B run.

    Args:
        run_dir: the foxdqn run folder (W&B writes ``run_dir/wandb/``; ``wandb_run_id`` is kept here).
        run_name: the W&B run's name (the foxdqn run name).
        config: the run's resolved config (nested dicts of plain values).
        mode: ``offline``, ``online`` or ``disabled``.
        project, entity: the W&B project and entity (None: the login's default entity).
        group: the W&B group (a sweep folder), or None.

    Attributes:
        run_id, mode, folder: the W&B run, its mode and the folder it is written to.

    Raises:
        ImportError: wandb is not installed.
    """

    def __init__(self, run_dir: Path, run_name: str, config: Mapping[str, Any], mode: str = "offline",
                 project: str = "foxdqn", entity: str | None = None, group: str | None = None) -> None:
        import wandb

        run_dir = Path(run_dir)
        id_file = run_dir / RUN_ID_FILE
        resumed = id_file.is_file()
        run_id = id_file.read_text().strip() if resumed else secrets.token_hex(4)  # 8 characters, as W&B's own
        # reinit="create_new": a run of its own even while another is active (the members of a
        # population log at once); this object holds it, nothing uses W&B's global run
        self.run = wandb.init(project=project, entity=entity, name=run_name, id=run_id, resume="allow", mode=mode,
                              dir=str(run_dir), group=group, config=dict(config), reinit="create_new",
                              settings=wandb.Settings(silent=True, console="off"))
        self.run_id, self.mode = run_id, str(mode)
        self.folder = Path(self.run.dir).parent if mode != "disabled" else None
        if not resumed:
            write_text_atomic(id_file, run_id + "\n")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Log the finite numeric values of ``metrics`` (name → Python number) at ``step``. A W&B
        failure costs a warning, never the training run."""
        row = {str(k): float(v) for k, v in metrics.items()
               if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v))}
        try:
            self.run.log(row, step=int(step))
        except Exception as exc:  # noqa: BLE001 - logging is not worth a lost run
            log.warning("W&B: the row at step %d was not logged (%s)", step, str(exc).splitlines()[0][:200])

    def log_final(self, step: int, metrics: Mapping[str, Any], equity_png: Path | None = None) -> None:
        """The final metrics into the run's summary and at ``step``, with the equity plot (when
        the file exists) as the image ``eval/equity``."""
        import wandb

        row = {str(k): v for k, v in metrics.items() if isinstance(v, numbers.Real) and not isinstance(v, bool)}
        try:
            self.run.summary.update(row)
            if equity_png is not None and Path(equity_png).is_file():
                row["eval/equity"] = wandb.Image(str(equity_png))
            self.run.log({k: v for k, v in row.items() if not (isinstance(v, float) and not math.isfinite(v))},
                         step=int(step))
        except Exception as exc:  # noqa: BLE001
            log.warning("W&B: the final metrics were not logged (%s)", str(exc).splitlines()[0][:200])

    def finish(self, exit_code: int = 0) -> None:
        """End the W&B run (a non-zero ``exit_code`` marks it crashed); a failure costs a warning."""
        try:
            self.run.finish(exit_code=int(exit_code))
        except Exception as exc:  # noqa: BLE001
            log.warning("W&B: the run's end was not recorded (%s)", str(exc).splitlines()[0][:200])
