"""The trading env's part of the generic collect step (:class:`foxdqn.envs.base.CollectHook`)."""
from __future__ import annotations

from torch import Tensor

from foxdqn.replay.buffer import ReplayCodec
from foxdqn.replay.regime import volatility_ratio

from foxdqn.envs.base import CollectHook, StepOut

__all__ = ["TRADING_HOOK", "TradingCollectHook"]


class TradingCollectHook(CollectHook):
    """State codes and the regime ratio of the state for the replay, the order fills for the monitor."""

    def replay_codec(self, env) -> ReplayCodec | None:
        """The state codes (:mod:`foxdqn.ops.trading_code`: ``env.code_dim`` values of
        ``env.code_dtype`` per state) decoded by ``env.decode_observations``; None for an env in
        eval mode (it returns no codes). docs/design/replay.md#windowed-trading-replay."""
        if env.eval_mode:
            return None
        return ReplayCodec(env.code_dim, env.code_dtype, env.decode_observations)

    def replay_stores_codes(self, env) -> None:
        """The replay stores ``env``'s state codes: its steps return no ``next_obs`` (only the
        replay's rows used it; one observation window per env and step fewer,
        ``env.step_next_obs``)."""
        env.step_next_obs = False

    def replay_rows(self, env, replay, obs: Tensor, out: StepOut) -> tuple[Tensor, Tensor]:
        """``(info["state_code"], info["next_state_code"])`` (``[N, 4]``) when ``replay`` decodes
        rows (``replay.decoder`` set), else the observations ``(obs, out.next_obs)``."""
        if replay.decoder is None:
            if out.next_obs is None:
                raise ValueError("the replay stores observations but the trading env returns no next_obs "
                                 "(env.step_next_obs is False: set it True for a replay without a decoder)")
            return obs, out.next_obs
        return out.info["state_code"], out.info["next_state_code"]

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
