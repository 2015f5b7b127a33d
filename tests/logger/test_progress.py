"""foxdqn.logger.progress.TrainProgress in its three modes."""
import io
import re
import time

import pytest

from foxdqn.logger.progress import TrainProgress, format_fields


def test_format_fields():
    assert format_fields({"epsilon": 0.1, "loss": 0.0123456, "return": -12.5, "n": 3}) == (
        "epsilon=0.1 loss=0.01235 return=-12.5 n=3"
    )
    assert format_fields({"loss": float("nan")}) == "loss=nan"


def test_disabled_is_noop():
    buf = io.StringIO()
    p = TrainProgress(100, enabled=False, file=buf)
    p.update(5, {"loss": 1.0})  # no start needed, no error
    with p:
        p.update(50, {"loss": 1.0})
    assert buf.getvalue() == ""
    assert p.mode == "disabled"


def test_plain_mode_prints_every_update_with_zero_interval():
    buf = io.StringIO()  # not a TTY -> plain lines
    with TrainProgress(1000, file=buf, plain_interval_s=0.0) as p:
        assert p.mode == "plain"
        p.update(100, {"epsilon": 0.5, "loss": 0.25})
        p.update(200, {"epsilon": 0.4, "loss": 0.125, "return": 3.0})
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("[train] 100/1,000 env steps (10.0%)")
    assert "steps/s" in lines[0] and lines[0].endswith("epsilon=0.5 loss=0.25")
    assert lines[1].startswith("[train] 200/1,000 env steps (20.0%)")
    assert lines[1].endswith("epsilon=0.4 loss=0.125 return=3")


def test_plain_mode_throttles_but_prints_first_final_and_pending():
    buf = io.StringIO()
    with TrainProgress(1000, file=buf, plain_interval_s=3600.0, description="dqn") as p:
        p.update(1, {"loss": 1.0})  # first: printed
        p.update(2, {"loss": 2.0})  # throttled
        p.update(3, {"loss": 3.0})  # throttled, pending -> printed on close
    lines = buf.getvalue().splitlines()
    assert [ln.split(" env")[0] for ln in lines] == ["[dqn] 1/1,000", "[dqn] 3/1,000"]
    assert lines[-1].endswith("loss=3")

    buf = io.StringIO()
    with TrainProgress(1000, file=buf, plain_interval_s=3600.0) as p:
        p.update(1, {})
        p.update(1000, {})  # reaching total: printed despite the interval
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 and "1,000/1,000 env steps (100.0%)" in lines[1]


def test_rich_mode_renders_bar_and_fields(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich reads the terminal width from COLUMNS
    buf = io.StringIO()
    with TrainProgress(1000, file=buf, force_terminal=True) as p:
        assert p.mode == "rich"
        p.update(250, {"epsilon": 0.5})
        time.sleep(0.02)
        p.update(500, {"epsilon": 0.25, "loss": 0.5})
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())  # strip ANSI codes
    assert "500/1,000 env steps" in out
    assert re.search(r"[0-9,]+ steps/s", out)
    assert "epsilon=0.25 loss=0.5" in out


def test_update_before_start_and_bad_total():
    p = TrainProgress(10, file=io.StringIO())
    with pytest.raises(RuntimeError, match="not started"):
        p.update(1, {})
    with pytest.raises(ValueError, match="total"):
        TrainProgress(0)
    with pytest.raises(ValueError, match="plain_interval_s"):
        TrainProgress(10, plain_interval_s=-1)


def test_plain_lines_carry_an_eta_from_the_resumed_start():
    import io

    from foxdqn.logger.progress import TrainProgress

    out = io.StringIO()
    with TrainProgress(total=1000, file=out, force_terminal=False, plain_interval_s=0.0, initial=400) as p:
        import time

        time.sleep(0.05)
        p.update(700, {"loss": 0.5})
    line = out.getvalue().splitlines()[0]
    assert "700/1,000 env steps (70.0%)" in line and "ETA 0:00:0" in line and "loss=0.5" in line


def test_rich_mode_fits_an_80_column_terminal(monkeypatch):
    """Every line of the live display fits 80 columns and shows the counts, rate, times and fields
    whole (the old one-row table was cut to `env steps 4,3… 0:…`)."""
    monkeypatch.setenv("COLUMNS", "80")
    buf = io.StringIO()
    fields = {"eps": 0.525, "loss": 0.03104, "ep_ret": -0.0366, "H": 0.9532, "extra_field": 123456.7,
              "another": 0.001234}
    with TrainProgress(100_000_000, file=buf, force_terminal=True) as p:
        p.update(4_300_000, fields)
        time.sleep(0.02)
        p.update(43_000_000, fields)
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue()).replace("\r", "\n")
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert lines and max(len(ln) for ln in lines) <= 80, max(lines, key=len)
    text = " ".join(out.split())
    assert "43% 43,000,000/100,000,000 env steps" in text
    assert re.search(r"[0-9,]+ steps/s, 0:00:0\d elapsed, (\d:\d\d:\d\d|\?) left", text)
    assert format_fields(fields) in text
