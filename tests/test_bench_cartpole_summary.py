"""bench.cartpole_bench.summary: medians over seeds with unreached seeds as +inf, and SB3 ratios."""
import math

import pandas as pd
import pytest

from bench.cartpole_bench import summary
from bench.run import _ratios, main


def _rows():
    def r(features, provider, seed, t, steps, rate):
        return {"section": "cartpole", "features": features, "provider": provider, "seed": seed, "device": "cuda",
                "time_to_475_s": t, "env_steps_to_475": steps, "env_steps_per_s": rate, "last_eval_return": 500.0}
    return pd.DataFrame([
        r("cartpole_dqn", "graph", 0, 2.0, 20_000, 1e4), r("cartpole_dqn", "graph", 1, None, None, 2e4),
        r("cartpole_dqn", "graph", 2, 4.0, 40_000, 3e4),
        r("cartpole_zoo", "graph", 0, None, None, 1e3), r("cartpole_zoo", "graph", 1, None, None, 1e3),
        r("cartpole_zoo", "graph", 2, 1.0, 9_000, 1e3),
        r("sb3_dqn_zoo", "sb3", 0, 30.0, 30_000, 1e3), r("sb3_dqn_zoo", "sb3", 1, 10.0, 10_000, 1e3),
        r("sb3_dqn_zoo", "sb3", 2, 20.0, 20_000, 1e3),
    ])


def test_median_counts_unreached_seeds_as_infinite():
    out = summary(_rows()).set_index("features")
    # cartpole_dqn: times {2, inf, 4} -> median 4; steps {20k, inf, 40k} -> 40k
    assert out.loc["cartpole_dqn", "seeds"] == 3 and out.loc["cartpole_dqn", "reached_475"] == 2
    assert out.loc["cartpole_dqn", "median time_to_475_s"] == 4.0
    assert out.loc["cartpole_dqn", "median env_steps_to_475"] == 40_000
    assert out.loc["cartpole_dqn", "median env_steps_per_s"] == 2e4
    # cartpole_zoo: one seed of three reached -> no median (and no ratio)
    assert math.isnan(out.loc["cartpole_zoo", "median time_to_475_s"])
    assert math.isnan(out.loc["cartpole_zoo", "SB3 median time / median time"])
    # SB3 median 20 s -> ratio 5 for cartpole_dqn, 1 for itself
    assert out.loc["cartpole_dqn", "SB3 median time / median time"] == 5.0
    assert out.loc["sb3_dqn_zoo", "SB3 median time / median time"] == 1.0


def test_no_sb3_rows_no_ratio_column():
    df = _rows()
    out = summary(df[df.provider != "sb3"])
    assert "SB3 median time / median time" not in out


def test_report_has_both_cartpole_tables():
    md = _ratios(_rows())
    assert "every run" in md and "medians over seeds" in md and "| sb3 " in md.replace("sb3_dqn_zoo", "")


@pytest.mark.parametrize("argv, needle", [
    (["--only", "cartpole_dqn,foo"], "--only: unknown rows ['foo']"),
    (["--sections", "cartpol"], "--sections: unknown ['cartpol']"),
    (["--seeds", "0"], "--seeds: must be >= 1"),
    (["--report", "/no/such.csv"], "--report: no such file"),
])
def test_bad_flags_exit_2_with_one_message(argv, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_report_rebuilds_md_from_csv(tmp_path):
    df = _rows().assign(gpu="NVIDIA H200", torch="2.11", triton="3.6", date="2026-11-30T00:00:00Z")
    path = tmp_path / "x.csv"
    df.to_csv(path, index=False)
    assert main(["--report", str(path)]) == 0
    md = (tmp_path / "x.md").read_text()
    assert md.startswith("# foxdqn bench — NVIDIA H200") and "medians over seeds" in md
    not_bench = tmp_path / "y.csv"
    not_bench.write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit):
        main(["--report", str(not_bench)])


def test_the_bench_says_only_what_it_wrote(tmp_path, capsys):
    """A section without a chart (startup) writes no .png, and the last line does not claim one."""
    import pandas as pd

    from bench.run import _write_report

    stem = tmp_path / "2026-12-02_cpu_startup"
    rows = pd.DataFrame([{"gpu": "cpu", "torch": "2", "triton": "3", "date": "2026-12-02", "section": "startup",
                          "series": "on", "run": 1, "wall_s": 6.0, "training_s": 0.5}])
    rows.to_csv(stem.with_suffix(".csv"), index=False)
    _write_report(rows, {"gpu": "cpu", "torch": "2", "triton": "3", "date": "2026-12-02"}, stem)
    assert capsys.readouterr().out.rstrip().splitlines()[-1] == f"wrote {stem}.csv, .md"
    assert stem.with_suffix(".md").is_file() and not stem.with_suffix(".png").exists()
