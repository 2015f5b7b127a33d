"""Regime-weighted TD errors: per-sample loss weights from the market regime of the sampled state.

The regime of a transition is its decision bar's volatility ratio ``r = v / m_v``: the env's
per-bar volatility at the bar of the state s (``TradingEnv.market_state()``) over the
training-split median volatility ``m_v`` — the statistic the exposure routing rule compares
(docs/environments.md#routing-rule; :mod:`foxdqn.ops.route_exposure_to_factored`, urgency)::

    regime = high    if r > high_threshold      (routing: v > 1.5 m_v)
           = low     elif r < low_threshold     (routing: v < 0.5 m_v)
           = normal  otherwise (also when m_v <= 0: r is stored as 1)

The ratio is written into the replay at insert time (one float32 per transition) and the weight
is looked up at sample time, so thresholds and weights are device tensors that may change
without a recapture. The loss weight of sample b is ``w_b = w_b^PER · w_regime(b)`` (importance
weight times regime weight; uniform replay: ``w_regime(b)``); the objectives compute
``Σ_b w_b ℓ_b / B``.

Priority rule: PER priorities use the *unweighted* |TD| (``LossOutput.td_abs`` never sees the
batch weights), so two transitions with the same TD error get the same priority whatever their
regime; only their contribution to the loss (and gradient) differs. This is the
"regime-scaled TD errors" step of the predecessor's captured iteration (docs/design/update.md#regime-weights;
``regime_scale_td_errors``), applied to the loss weights instead of the priorities.
"""
from __future__ import annotations

import torch
from torch import Tensor

LOW, NORMAL, HIGH = 0, 1, 2


def volatility_ratio(volatility: Tensor, median_volatility: float) -> Tensor:
    """float32 ``[N]`` ratio ``v / m_v`` (1 where ``m_v <= 0``: regime normal, like the routing
    rule). ``volatility``: ``[N]`` any float dtype (per-bar volatility, >= 0)."""
    v = volatility.to(torch.float32)
    if median_volatility <= 0:  # a run constant (host float), not a device value
        return torch.ones_like(v)
    return v / float(median_volatility)


class RegimeWeights:
    """Regime index and loss weight of volatility ratios (device ops only, capture-safe).

    Args:
        low_threshold, high_threshold: ``0 < low < high`` (``regime.low_threshold`` 0.5,
            ``regime.high_threshold`` 1.5), in units of the median volatility.
        weights: ``[w_low, w_normal, w_high]`` (``regime.weights``), each >= 0.
        device: where the threshold and weight tensors live.

    Attributes: low, high (float32 0-d), weights (float32 [3]); change them in place.
    """

    def __init__(self, low_threshold: float, high_threshold: float, weights, device: torch.device):
        f32 = dict(dtype=torch.float32, device=device)
        self.low = torch.tensor(float(low_threshold), **f32)
        self.high = torch.tensor(float(high_threshold), **f32)
        self.weights = torch.tensor([float(w) for w in weights], **f32)
        if self.weights.shape != (3,):
            raise ValueError(f"regime.weights must have 3 entries [low, normal, high], got {list(weights)}")

    def index(self, ratio: Tensor) -> Tensor:
        """int64 regime (0 low, 1 normal, 2 high) of float32 ratios ``[B]`` (NaN → normal)."""
        one = torch.ones_like(ratio, dtype=torch.int64)
        return torch.where(ratio > self.high, one * HIGH, torch.where(ratio < self.low, one * LOW, one * NORMAL))

    def __call__(self, ratio: Tensor) -> Tensor:
        """float32 ``[B]`` loss weights of the ratios ``[B]``."""
        return self.weights[self.index(ratio)]
