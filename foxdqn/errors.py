"""Errors that end a run with one clear line and exit code 2.

Anything raised as a :class:`FoxdqnError` is caught by ``python -m foxdqn.train``, printed as
one line on stderr (``foxdqn: error: <message>``) and turned into exit code 2. The message must
name the field, file, column or row at fault and say what is allowed.
"""


class FoxdqnError(ValueError):
    """Base class of user-facing errors (bad input, bad configuration)."""

    exit_code = 2


class DataError(FoxdqnError):
    """A market-data file or built-in dataset is missing, unparsable or invalid."""


class ConfigError(FoxdqnError):
    """A configuration value is invalid or two settings are incompatible."""


class StoppedBySignal(Exception):
    """Training stopped on SIGINT or SIGTERM after its current iteration, its checkpoints written;
    the message says how to continue. ``exit_code`` is 128 + ``signum`` (130, 143)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum, self.exit_code = signum, 128 + signum


class HaltError(RuntimeError):
    """Training stopped by an on-device guard flag (NaN/Inf, loss clip, gradient collapse, Q divergence)."""

    exit_code = 3
