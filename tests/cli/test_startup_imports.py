"""What a run imports before its work: a run without market data (CartPole) never loads pandas
(about 0.3-0.6 s of every start on a 2-core CPU); foxdqn.data's names still load on first use."""
from __future__ import annotations

from support import fresh_python


def test_a_cartpole_run_and_a_sweeps_callbacks_do_not_import_pandas():
    code = ("import sys\n"
            "import foxdqn.train, foxdqn.population.train, foxdqn.job.check\n"
            "from foxdqn.cli.callbacks import SweepReport\n"
            "from foxdqn.config.compose import load_config\n"
            "cfg = load_config(['+experiment=cartpole_cleanrl', 'device=cpu'])\n"
            "SweepReport()\n"
            "before = 'pandas' in sys.modules\n"
            "from foxdqn.data import load_market_data, DataConfig\n"
            "import foxdqn.data\n"
            "print(before, 'pandas' in sys.modules, callable(load_market_data), 'MarketData' in dir(foxdqn.data))\n")
    assert fresh_python(code) == ["False", "True", "True", "True"]
