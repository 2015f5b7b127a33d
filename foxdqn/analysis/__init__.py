"""One run's results: the backtest of a policy on a split against buy-and-hold, flat and the oracle
(backtest.py), its equity plot, metrics (Sharpe, Sortino, max drawdown, profit factor), significance
(PSR, block-bootstrap interval) and the console table. docs/backtest.md."""
