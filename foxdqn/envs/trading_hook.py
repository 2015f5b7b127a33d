"""The trading env's part of the generic collect step (:class:`foxdqn.envs.base.CollectHook`)."""
from __future__ import annotations

from torch import Tensor

from foxdqn.replay.regime import volatility_ratio

from .base import CollectHook, StepOut

__all__ = ["TRADING_HOOK", "TradingCollectHook"]


class TradingCollectHook(CollectHook):
    """Regime ratio of the state for the replay, and the order fills for the monitor."""

    def replay_extras(self, env, replay) -> dict[str, Tensor]:
        """``{"vol_ratio": [N] float32}`` when ``replay`` has regime weights (``replay.regime``), else
        ``{}``: the volatility at each env's current bar (the state acted on) over the env's
        ``median_volatility`` (:func:`foxdqn.replay.regime.volatility_ratio`). Sync-free.

        Args:
            env: a :class:`~foxdqn.envs.TradingEnv`, before it steps.
            replay: the replay the transition goes into.
        """
        if replay.regime is None:
            return {}
        return {"vol_ratio": volatility_ratio(env.market_state()[1], env.median_volatility)}

    def trades(self, out: StepOut) -> Tensor:
        """``out.info["fill"]``: ``[N]`` bool, the envs whose order filled on this step."""
        return out.info["fill"]


TRADING_HOOK = TradingCollectHook()
