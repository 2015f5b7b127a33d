"""Log lines for the run's log file, not its console: the action-diversity line of each log
boundary and the start-up breakdown (``timings.json`` has it too).

A record logged with ``extra=DETAIL`` goes to every handler as usual; the console handler of
``python -m foxdqn.train`` carries :class:`ConsoleDetail` (conf/train.yaml, ``hydra.job_logging``),
which drops it unless the ``foxdqn`` logger is at DEBUG (``hydra.verbose=foxdqn`` or
``hydra.verbose=true``). So the console keeps the progress display, warnings and the results, and
``<run>/train.log`` keeps every line.
"""
from __future__ import annotations

import logging

#: ``log.info(..., extra=DETAIL)``: a line for the log file; on the console only at DEBUG.
DETAIL = {"foxdqn_detail": True}


class ConsoleDetail(logging.Filter):
    """Drop :data:`DETAIL` records unless the ``foxdqn`` logger is enabled for DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "foxdqn_detail", False) or logging.getLogger("foxdqn").isEnabledFor(logging.DEBUG)
