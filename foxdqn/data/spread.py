"""Relative bid-ask spread estimated from highs and lows: Corwin & Schultz (2012).

Source: S. A. Corwin and P. Schultz, "A Simple Way to Estimate Bid-Ask Spreads from Daily High
and Low Prices", Journal of Finance 67(2), 719-760, 2012. For the two bars t-1 and t:

* ``beta  = ln(H[t-1]/L[t-1])**2 + ln(H[t]/L[t])**2`` (sum of the squared one-bar log ranges),
* ``gamma = ln(max(H[t-1], H[t]) / min(L[t-1], L[t]))**2`` (squared two-bar log range),
* ``alpha = (sqrt(2 beta) - sqrt(beta)) / (3 - 2 sqrt 2) - sqrt(gamma / (3 - 2 sqrt 2))``  (eq. 18),
* ``S = 2 (exp(alpha) - 1) / (1 + exp(alpha))``  (eq. 14), the spread as a fraction of price.

As in the paper, bar t's high and low are first adjusted for the gap from the previous close
C[t-1]: if L[t] > C[t-1] both are shifted down by L[t] - C[t-1]; if H[t] < C[t-1] both are
shifted up by C[t-1] - H[t] (the authors' reference code does the same). Negative two-bar
estimates are set to 0 (the paper's main variant); the first bar, which has no predecessor, gets 0.
"""
import numpy as np
import pandas as pd

_K = 3.0 - 2.0 * np.sqrt(2.0)


def corwin_schultz(high: np.ndarray, low: np.ndarray, close: np.ndarray) -> np.ndarray:
    """Two-bar Corwin-Schultz spread per bar, float64 ``[T]``, fraction of price, >= 0.

    Row t uses bars t-1 and t only; row 0 is 0. Inputs are float64 ``[T]`` positive prices with
    ``low <= high``.
    """
    out = np.zeros(high.shape, dtype=np.float64)
    if len(high) < 2:
        return out
    prev_high, prev_low, prev_close = high[:-1], low[:-1], close[:-1]
    cur_high, cur_low = high[1:].copy(), low[1:].copy()
    gap_up = np.maximum(cur_low - prev_close, 0.0)      # bar opened above the previous close
    gap_down = np.maximum(prev_close - cur_high, 0.0)   # bar opened below the previous close
    cur_high += gap_down - gap_up
    cur_low += gap_down - gap_up
    beta = np.log(prev_high / prev_low) ** 2 + np.log(cur_high / cur_low) ** 2
    gamma = np.log(np.maximum(prev_high, cur_high) / np.minimum(prev_low, cur_low)) ** 2
    alpha = (np.sqrt(2.0 * beta) - np.sqrt(beta)) / _K - np.sqrt(gamma / _K)
    spread = 2.0 * (np.exp(alpha) - 1.0) / (1.0 + np.exp(alpha))
    out[1:] = np.maximum(spread, 0.0)
    return out


def estimate_spread(high: np.ndarray, low: np.ndarray, close: np.ndarray, window: int) -> np.ndarray:
    """Corwin-Schultz spread smoothed by a causal rolling mean over ``window`` bars.

    Float64 ``[T]``, fraction of price, >= 0. Row t averages the two-bar estimates of rows
    ``max(0, t-window+1) .. t`` (a shorter window during the first ``window - 1`` bars).
    """
    two_bar = pd.Series(corwin_schultz(high, low, close))
    # max(.., 0): the rolling sum's add/remove updates can leave -1e-20 where the window is all 0.
    return np.maximum(two_bar.rolling(window, min_periods=1).mean().to_numpy(), 0.0)
