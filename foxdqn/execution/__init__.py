"""The trading execution model: the 45 orders an agent chooses from (orders.py) and how they fill,
with fees, spread, slippage and switch costs (fills.py). docs/environments.md, docs/backtest.md."""
