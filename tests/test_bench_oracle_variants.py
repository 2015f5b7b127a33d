"""bench.oracle_variants: the near-oracle is one of the variants and walks as foxdqn's oracle does."""
import pytest
import torch

from bench.oracle_variants import NEAR_ORACLE, VARIANTS, main, variants_on
from foxdqn.analysis.backtest import evaluate
from foxdqn.config.compose import load_config
from foxdqn.data import load_market_data


def test_the_near_oracle_variant_is_the_oracle():
    extra = ["data.synthetic.bars=3000"]
    rows = dict((n, (r, t)) for n, r, t in variants_on(0.2, 0, extra))
    assert len(rows) == len(VARIANTS) == 48
    cfg = load_config(["data.name=ar1_1h", "data.synthetic.phi=0.2", "data.synthetic.seed=0", "device=cpu", *extra])
    market = load_market_data(cfg.data, cfg.env.window, cfg.env.episode_length)
    oracle = evaluate(cfg, market, torch.nn.Identity(), torch.device("cpu"), policies=("oracle",))["metrics"]["oracle"]
    assert rows[NEAR_ORACLE] == (pytest.approx(oracle["total_return"]), oracle["num_trades"])
    assert rows["G/mkt/nor/k=2"][1] < rows[NEAR_ORACLE][1] < rows["G/mkt/nor/k=0"][1]  # a higher threshold trades less


def test_bad_markets_are_refused(capsys):
    assert main(["0.2"]) == 2 and "PHI:MARKET_SEED" in capsys.readouterr().err
