"""Trading environments: the 45-action space, the execution model and the batched env."""
from .actions import (
    EXPOSURES,
    FLAT,
    NUM_ACTIONS,
    ORDER_TYPES,
    URGENCIES,
    action_name,
    compose,
    factor,
)
from .execution import ExecutionConfig
from .trading import StepOut, TradingEnv

__all__ = [
    "EXPOSURES",
    "FLAT",
    "NUM_ACTIONS",
    "ORDER_TYPES",
    "URGENCIES",
    "ExecutionConfig",
    "StepOut",
    "TradingEnv",
    "action_name",
    "compose",
    "factor",
]
