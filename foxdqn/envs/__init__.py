"""Environments: the env interface (:mod:`.base`), the 45-action space, the execution model and the trading env."""
from foxdqn.execution.orders import (
    EXPOSURES,
    FLAT,
    NUM_ACTIONS,
    ORDER_TYPES,
    URGENCIES,
    action_name,
    compose,
    factor,
)
from foxdqn.envs.base import BatchedEnv, CollectHook, StepOut
from foxdqn.execution.fills import ExecutionConfig
from foxdqn.envs.trading import TradingEnv

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
