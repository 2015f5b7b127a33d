"""Environments: the env interface (:mod:`.base`), the 45-action space, the execution model and the trading env."""
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
from .base import BatchedEnv, CollectHook, StepOut
from .execution import ExecutionConfig
from .trading import TradingEnv

__all__ = [
    "BatchedEnv",
    "CollectHook",
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
