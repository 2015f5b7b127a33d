"""Trust: a checkpoint never runs code, resume never changes or mixes a run, a refused run never
touches another's folder, bad data and exploding updates are caught (docs/usage.md#failure-behaviour)."""
from __future__ import annotations

import hashlib
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from foxdqn.run.checkpoint import MAGIC, FORMAT, encode, load_checkpoint, upgrade_file
from foxdqn.errors import ConfigError, DataError

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
SMOKE = ["debug=smoke", "log.progress=false", "device=cpu", "logger=csv"]


@pytest.fixture(scope="module")
def train(cli):
    """``python -m foxdqn.train ARGS`` in ``cwd``: its CompletedProcess (conftest's ``cli``)."""
    def call(*args, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
        return cli("foxdqn.train", args, cwd=cwd, timeout=timeout)
    return call


def tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative path → SHA-256 of its bytes)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, train) -> Path:
    """A finished smoke run of eurusd_dqn (seed 0) with a periodic checkpoint."""
    root = tmp_path_factory.mktemp("trust")
    res = train(*SMOKE, "checkpoint.every_env_steps=1024", f"hydra.run.dir={root / 'run'}", cwd=root)
    assert res.returncode == 0, res.stderr[-2000:]
    return root / "run"


def copy_run(src: Path, dst: Path, killed: bool = True) -> Path:
    """A copy of run ``src`` at ``dst``; ``killed``: as if killed before its end (INCOMPLETE, no eval/)."""
    shutil.copytree(src, dst)
    if killed:
        shutil.rmtree(dst / "eval", ignore_errors=True)
        (dst / "INCOMPLETE").write_text("killed\n")
    return dst


class _Evil:
    """Unpickling this runs ``touch <marker>``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def evil_pickle(marker: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save({"online": {}, "config": {}, "x": _Evil(marker)}, buffer)
    return buffer.getvalue()


def evil_with_header(marker: Path) -> bytes:
    """A malicious pickle behind a valid header (the right size and SHA-256)."""
    body = evil_pickle(marker)
    header = json.dumps({"format": FORMAT, "sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body)})
    return MAGIC + header.encode() + b"\n" + body


def test_an_unpickled_malicious_file_does_run_code(tmp_path):
    """The test's own malicious file works (so the tests below can fail)."""
    marker = tmp_path / "pwned"
    torch.load(io.BytesIO(evil_pickle(marker)), weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("make", [evil_pickle, evil_with_header])
def test_load_checkpoint_runs_no_code(tmp_path, make):
    marker, path = tmp_path / "pwned", tmp_path / "last.pt"
    path.write_bytes(make(marker))
    with pytest.raises(ConfigError, match=str(path)):
        load_checkpoint(path)
    assert not marker.exists()


@pytest.mark.parametrize("entry", ["evaluate", "resume=PATH", "resume=auto"])
@pytest.mark.parametrize("make", [evil_pickle, evil_with_header])
def test_every_entry_point_refuses_a_malicious_checkpoint(train, cli, finished_run, tmp_path, entry, make):
    run_dir = copy_run(finished_run, tmp_path / "run")
    marker = tmp_path / "pwned"
    ckpt = run_dir / "checkpoints" / "last.pt"
    ckpt.write_bytes(make(marker))
    if entry == "evaluate":
        res = cli("foxdqn.evaluate", [f"checkpoint={ckpt}"], cwd=tmp_path)
    elif entry == "resume=PATH":
        res = train(f"resume={ckpt}", f"hydra.run.dir={tmp_path / 'other'}", cwd=tmp_path)
    else:
        res = train("resume=auto", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "foxdqn: error: checkpoint" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not marker.exists()


def test_a_flipped_byte_a_cut_file_and_a_damaged_header_are_refused(cli, finished_run, tmp_path):
    data = (finished_run / "checkpoints" / "last.pt").read_bytes()
    assert load_checkpoint(finished_run / "checkpoints" / "last.pt")["format"] == FORMAT
    cases = {
        "flip": bytearray(data),
        "cut": data[: len(data) - 100],
        "header": data.replace(b'"sha256": "', b'"sha256": "0', 1),
        "foreign": b"hello",
    }
    cases["flip"][len(data) // 2] ^= 0x01
    needles = {"flip": "SHA-256", "cut": "cut short", "header": "SHA-256", "foreign": "not a foxdqn checkpoint"}
    for name, content in cases.items():
        path = tmp_path / f"{name}.pt"
        path.write_bytes(bytes(content))
        with pytest.raises(ConfigError, match=needles[name]):
            load_checkpoint(path)
    res = cli("foxdqn.evaluate", [f"checkpoint={tmp_path / 'flip.pt'}"], cwd=tmp_path)
    assert res.returncode == 2 and "SHA-256" in res.stderr


def test_an_older_pickled_checkpoint_is_refused_with_the_command_that_converts_it(cli, finished_run, tmp_path):
    current = load_checkpoint(finished_run / "checkpoints" / "last.pt")
    old = dict(current, format=3)  # what foxdqn wrote before: a plain torch.save, numpy floats in the loop state
    old["loop"] = {"recent_return": np.float64(-0.25), "wall_before": np.float64(1.5)}
    path = tmp_path / "old.pt"
    torch.save(old, path)
    with pytest.raises(ConfigError, match=f"python -m foxdqn.run.checkpoint upgrade {path}"):
        load_checkpoint(path)
    res = cli("foxdqn.run.checkpoint", ["upgrade", path], cwd=tmp_path, timeout=120)
    assert res.returncode == 0 and "upgraded" in res.stdout
    new = load_checkpoint(path)
    assert new["format"] == FORMAT and type(new["loop"]["recent_return"]) is float
    assert all(torch.equal(new["online"][k], current["online"][k]) for k in current["online"])
    with pytest.raises(ConfigError, match="already in the current format"):
        upgrade_file(path)


def old_loop_checkpoint(member: dict) -> dict:
    """What the single-run loop of an older foxdqn wrote for the run of member checkpoint ``member``:
    the same weights, counters, config and run id, its state under ``tensors`` / ``generators`` /
    ``loop``, no ``population`` and no ``member_state``."""
    keep = ("format", "online", "target", "env_steps", "updates", "config", "run_id")
    return {**{k: member[k] for k in keep}, "optimizer": {"state": {}, "param_groups": []},
            "tensors": {"rollout.obs": torch.zeros(2, 3)}, "generators": {}, "replay_saved": False,
            "loop": {"stopper": None, "recent_return": -0.25, "wall_before": 1.5}}


@pytest.mark.parametrize("entry", ["resume=auto", "resume=PATH"])
def test_a_checkpoint_of_the_old_single_run_loop_is_refused_on_resume_and_evaluates(train, cli, finished_run,
                                                                                   tmp_path, entry):
    from foxdqn.run.checkpoint import write_payload

    run_dir = copy_run(finished_run, tmp_path / "run")
    ckpt = run_dir / "checkpoints" / "last.pt"
    write_payload(ckpt, old_loop_checkpoint(load_checkpoint(ckpt)))
    before = tree(run_dir)
    if entry == "resume=auto":
        res = train("resume=auto", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    else:
        res = train(f"resume={ckpt}", f"hydra.run.dir={tmp_path / 'other'}", cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"foxdqn: error: resume: checkpoint {ckpt} was written by the "
                                                   "single-run training loop"), lines
    assert "start a new run" in lines[0] and f"python -m foxdqn.evaluate checkpoint={ckpt}" in lines[0]
    assert tree(run_dir) == before  # nothing in the run folder changed
    assert not (tmp_path / "other").exists()
    res = cli("foxdqn.evaluate", [f"checkpoint={ckpt}", "split=val"], cwd=tmp_path)  # its weights still evaluate
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads((run_dir / "evaluations" / "last_val" / "summary.json").read_text())
    assert summary["checkpoint_env_steps"] == load_checkpoint(ckpt)["env_steps"]


def test_a_checkpoint_body_holds_only_tensors_and_plain_data():
    with pytest.raises(TypeError, match=r"checkpoint\['loop'\]\['x'\] is a numpy.float64"):
        encode({"loop": {"x": np.float64(1.0)}})
    with pytest.raises(TypeError, match=r"checkpoint\['o'\] is a .*_Evil"):
        encode({"o": _Evil(Path("x"))})
    assert encode({"a": [1, 2.0, "s", None, (True,)], "t": torch.zeros(2)}).startswith(MAGIC)


def _same(a, b, where="payload"):
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            _same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def test_a_packed_body_gives_back_every_tensor_as_its_own_copy_where_it_was():
    """Format 5: the tensors of any nesting (dicts, OrderedDicts, lists, tuples, int keys), dtypes,
    shapes (0-d, empty, a transposed view), the same tensor twice, and a None beside them come
    back equal, contiguous and each in its own storage; the body pickles one tensor per dtype."""
    from collections import OrderedDict

    from foxdqn.run.checkpoint import pack, decode

    shared = torch.arange(4.0)
    payload = {"format": FORMAT, "online": OrderedDict(w=torch.arange(6.0).view(2, 3).t(), b=torch.zeros(0, 3)),
               "loop": {"stats": [None, (1, torch.tensor(True)), {"n": None}], 3: torch.tensor(2.5, dtype=torch.float64)},
               "twice": [shared, shared], "half": torch.ones(2, dtype=torch.bfloat16), "config": {"a": {"b": [1, "x"]}}}
    body = pack(payload)
    assert sorted(body["buffers"]) == ["bfloat16", "bool", "float32", "float64"]
    assert body["packed"]["config"] is payload["config"]  # a container without tensors is not copied
    back = decode(encode(payload), "mem")
    _same(payload, back)
    tensors = [back["online"]["w"], back["online"]["b"], back["loop"]["stats"][1][1], back["loop"][3],
               *back["twice"], back["half"]]
    assert all(t.is_contiguous() for t in tensors)
    assert len({t.untyped_storage().data_ptr() for t in tensors if t.numel()}) == len([t for t in tensors if t.numel()])


def test_a_packed_index_that_does_not_fit_its_buffers_or_payload_is_refused(tmp_path):
    """A body whose index points outside its buffer, names another dtype, repeats a tensor or
    names a place the payload does not have is one ConfigError naming the file (behind a valid
    header: only a crafted file gets there)."""
    from foxdqn.run.checkpoint import pack

    def with_header(body: dict) -> bytes:
        buffer = io.BytesIO()
        torch.save(body, buffer)
        raw = buffer.getvalue()
        header = json.dumps({"format": FORMAT, "sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)})
        return MAGIC + header.encode() + b"\n" + raw

    def good():
        return pack({"online": {"w": torch.ones(3)}, "config": {}, "x": [None]})

    bad = []
    for change in (lambda b: b["tensors"][0].__setitem__(2, 1),  # offset + size past the buffer
                   lambda b: b["tensors"][0].__setitem__(1, "int64"),  # a dtype without a buffer
                   lambda b: b["tensors"][0].__setitem__(3, [-3]),  # a negative size
                   lambda b: b["tensors"].append(list(b["tensors"][0])),  # the same place twice
                   lambda b: b["tensors"][0].__setitem__(0, ["online", "v"]),  # a place the payload lacks
                   lambda b: b["tensors"][0].__setitem__(0, ["config"]),  # where the payload holds a value
                   lambda b: b.pop("buffers")):
        body = good()
        change(body)
        bad.append(body)
    path = tmp_path / "last.pt"
    path.write_bytes(with_header(good()))
    assert torch.equal(load_checkpoint(path)["online"]["w"], torch.ones(3))
    for body in bad:
        path.write_bytes(with_header(body))
        with pytest.raises(ConfigError, match=rf"{path}: (its packed tensors are damaged|not a foxdqn)"):
            load_checkpoint(path)


def test_a_format_4_body_still_loads(tmp_path):
    """A checkpoint an earlier foxdqn wrote in format 4 (the payload itself as the body) loads as it was."""
    buffer = io.BytesIO()
    torch.save({"format": 4, "online": {"w": torch.ones(2)}, "config": {}}, buffer)
    raw = buffer.getvalue()
    header = json.dumps({"format": 4, "sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)})
    path = tmp_path / "last.pt"
    path.write_bytes(MAGIC + header.encode() + b"\n" + raw)
    payload = load_checkpoint(path)
    assert payload["format"] == 4 and torch.equal(payload["online"]["w"], torch.ones(2))


@pytest.mark.slow
def test_resume_auto_keeps_the_recorded_config_of_a_run_killed_before_its_first_checkpoint(train, tmp_path):
    """The short form `resume=auto hydra.run.dir=RUN` of a run killed before its first checkpoint
    starts that run over with its own config, not the default one, and ends with the results of
    the run that was never killed."""
    started = ["+experiment=googl_dqn", *SMOKE, "agent.total_env_steps=1536", "optim.lr=0.001",
               "log.interval_env_steps=512", "checkpoint.every_env_steps=1024"]
    whole = train(*started, f"hydra.run.dir={tmp_path / 'whole'}", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr[-2000:]
    for name, keep in (("record", ("config.yaml", ".hydra", "INCOMPLETE", "metrics.csv")),
                       ("hydra", (".hydra",))):
        run_dir = tmp_path / name
        shutil.copytree(tmp_path / "whole", run_dir)
        for p in list(run_dir.iterdir()):  # what a kill before the first checkpoint (or before the record) leaves
            if p.name not in keep:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        if "INCOMPLETE" in keep:
            (run_dir / "INCOMPLETE").write_text("killed\n")
        res = train("resume=auto", f"hydra.run.dir={run_dir}", cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-2000:]
        summary = json.loads((run_dir / "eval" / "summary.json").read_text())
        reference = json.loads((tmp_path / "whole" / "eval" / "summary.json").read_text())
        assert summary["experiment"] == "googl_dqn" and summary["env_steps"] == reference["env_steps"] == 1536
        assert summary["metrics"]["agent"] == reference["metrics"]["agent"]
        rows, ref_rows = (pd.read_csv(d / "metrics.csv") for d in (run_dir, tmp_path / "whole"))
        drop = [c for c in ref_rows.columns if c.endswith("per_s")]
        assert rows.drop(columns=drop).equals(ref_rows.drop(columns=drop))  # the run's own log settings kept
        assert (run_dir / ".hydra" / "overrides.yaml").read_text() == \
            (tmp_path / "whole" / ".hydra" / "overrides.yaml").read_text()


def test_resume_path_only_continues_a_run_in_its_own_folder(train, finished_run, tmp_path):
    loose = tmp_path / "loose" / "last.pt"
    loose.parent.mkdir()
    shutil.copy(finished_run / "checkpoints" / "last.pt", loose)
    res = train(f"resume={loose}", cwd=tmp_path)
    assert res.returncode == 2 and "not a checkpoint inside a run folder" in res.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["loose"]  # nothing written two levels up, no outputs/
    assert [p.name for p in loose.parent.iterdir()] == ["last.pt"]


def test_a_checkpoint_of_another_run_is_never_continued(train, finished_run, tmp_path):
    other = train(*SMOKE, "seed=1", "checkpoint.every_env_steps=1024", f"hydra.run.dir={tmp_path / 'b'}",
                  cwd=tmp_path)
    assert other.returncode == 0, other.stderr[-2000:]
    target = copy_run(tmp_path / "b", tmp_path / "target")
    shutil.copy(finished_run / "checkpoints" / "last.pt", target / "checkpoints" / "last.pt")  # run a's into b's
    before = tree(target)
    for args in (["resume=auto", f"hydra.run.dir={target}"],
                 [f"resume={target / 'checkpoints' / 'last.pt'}", f"hydra.run.dir={tmp_path / 'new'}"]):
        res = train(*args, cwd=tmp_path)
        assert res.returncode == 2 and "belongs to another run" in res.stderr, res.stderr[-2000:]
        assert tree(target) == before
    same = copy_run(finished_run, tmp_path / "same")  # the same config and seed, another run id: refused too
    shutil.copy(target / "config.yaml", same / "config.yaml")
    res = train("resume=auto", f"hydra.run.dir={same}", cwd=tmp_path)
    assert res.returncode == 2 and "belongs to another run" in res.stderr


def test_a_refused_run_leaves_the_folder_as_it_was(train, finished_run, tmp_path):
    run_dir = copy_run(finished_run, tmp_path / "run", killed=False)
    before = tree(run_dir)
    res = train(*SMOKE, "seed=7", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert res.returncode == 2 and "already holds a run" in res.stderr
    assert {k: v for k, v in tree(run_dir).items() if not k.endswith(".log")} == \
        {k: v for k, v in before.items() if not k.endswith(".log")}
    from foxdqn.report.seeds import read_job

    assert not any(o.startswith("seed=") for o in read_job(run_dir)["overrides"])  # still the seed-0 run


def test_a_bar_that_jumps_is_refused_naming_the_file_and_row(tmp_path):
    from foxdqn.data import DataConfig, load_market_data

    from foxdqn.data.synthetic import make_martingale_ohlcv

    frame = make_martingale_ohlcv(400, vol_per_bar=1e-3, substeps=4, seed=0, freq="1h", start="2017-01-02")
    frame = frame.reset_index() if "timestamp" not in frame.columns else frame
    frame.loc[200, ["high", "close"]] *= 1e5  # a typo's jump (a bar priced 1e300 is beyond the price range)
    path = tmp_path / "bars.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(DataError, match=r"bars\.csv.*'high'.*row 201.*data\.max_abs_log_return=1"):
        load_market_data(DataConfig(path=str(path)), window=8)
    load_market_data(DataConfig(path=str(path), max_abs_log_return=None, on_gaps="ignore"), window=8)
    with pytest.raises(ConfigError, match="data.max_abs_log_return"):
        DataConfig(max_abs_log_return=-1.0).validate()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_learning_rate_of_1e3_halts_with_the_initial_weights(tmp_path, device):
    from foxdqn.config.compose import load_config
    from foxdqn.errors import HaltError
    from foxdqn.job.check import market_data
    from foxdqn.population.state import build_population

    from support import train_run

    cfg = load_config(["debug=smoke", f"device={device}", "optim.lr=1000", "log.progress=false", "logger=csv"])
    initial = {k: v.cpu() for k, v in build_population([cfg], market_data(cfg), torch.device(device)).online
               .member_state_dict(0).items()}
    with pytest.raises(HaltError):
        train_run(cfg, market_data(cfg), tmp_path)
    saved = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert saved["updates"] >= 1
    for key, value in initial.items():
        assert torch.equal(saved["online"][key], value), key
    assert max(v.abs().max().item() for v in saved["online"].values()) < 10


def test_a_full_file_is_named(tmp_path):
    """A write past the file-size limit (EFBIG, as a full disk's ENOSPC) names the file."""
    limit = 64 * 1024

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    res = subprocess.run([sys.executable, "-m", "foxdqn.train", *SMOKE, f"hydra.run.dir={tmp_path / 'run'}"],
                         cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300, preexec_fn=small_files)
    assert res.returncode == 2, res.stderr[-2000:]
    line = res.stderr.strip().splitlines()[-1]
    assert "writing the run's outputs failed" in line and str(tmp_path / "run") in line and "too large" in line


def test_a_build_that_fails_leaves_no_folder(tmp_path, monkeypatch, capsys):
    from foxdqn.population import train as loop  # a single run builds as a population of one
    from foxdqn.config.compose import load_config
    from foxdqn.job.check import market_data
    from foxdqn.job.run import run_job

    cfg = load_config(["debug=smoke", "device=cpu"])

    def out_of_memory(*args, **kwargs):
        raise MemoryError("can't allocate memory")

    monkeypatch.setattr(loop, "build_population", out_of_memory)
    run_dir = tmp_path / "new" / "run"
    with pytest.raises(SystemExit) as stop:
        run_job(cfg, market_data(cfg), run_dir)
    assert stop.value.code == 2 and "out of memory" in capsys.readouterr().err
    assert not run_dir.exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_imports_and_start_up_is_one_line_and_128_plus_signal(tmp_path, sig):
    """From the first lines of python -m foxdqn.train on (the imports take seconds): one line and
    128 + the signal, at moments spread over the imports and the start-up."""
    for delay in (0.3, 0.6, 0.9, 1.4, 2.5):
        proc = subprocess.Popen([sys.executable, "-m", "foxdqn.train", *SMOKE, f"hydra.run.dir={tmp_path / 'run'}"],
                                cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        if proc.returncode == 0:  # it finished first: nothing to check at this moment
            continue
        lines = err.strip().splitlines()
        assert proc.returncode == 128 + sig and len(lines) == 1 and f"interrupted by {sig.name}" in lines[0], \
            (delay, proc.returncode, err[-3000:])
        shutil.rmtree(tmp_path / "run", ignore_errors=True)


def test_upgrade_refuses_a_pickle_that_names_anything_else_without_running_it(cli, tmp_path):
    marker, path = tmp_path / "pwned", tmp_path / "evil.pt"
    path.write_bytes(evil_pickle(marker))
    before = path.read_bytes()
    res = cli("foxdqn.run.checkpoint", ["upgrade", path], cwd=tmp_path, timeout=120)
    assert res.returncode == 2 and "not an older foxdqn checkpoint" in res.stderr
    assert not marker.exists() and path.read_bytes() == before


@pytest.mark.slow
def test_a_second_resume_never_touches_a_run_that_is_training(train, tmp_path):
    """resume=auto into a folder whose run is still training before its first checkpoint is refused
    by the folder's lock before anything is removed: the running run is not harmed."""
    run_dir = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "foxdqn.train", "log.progress=false", "device=cpu", "logger=csv",
                              "agent.total_env_steps=40000", "log.interval_env_steps=1024",
                              "checkpoint.every_env_steps=0", f"hydra.run.dir={run_dir}"],
                             cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (run_dir / "metrics.csv").is_file():
            time.sleep(0.05)
        assert (run_dir / "metrics.csv").is_file()
        second = train("resume=auto", f"hydra.run.dir={run_dir}", cwd=tmp_path)
        assert second.returncode == 2 and "another run is writing into it" in second.stderr
        assert (run_dir / "metrics.csv").is_file()
    finally:
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=300)
    assert first.returncode == 130, err[-2000:]  # it trained on and stopped with its checkpoint


def test_an_edited_record_or_a_checkpoint_without_its_record_is_refused(train, finished_run, tmp_path):
    edited = copy_run(finished_run, tmp_path / "edited")
    shutil.rmtree(edited / "checkpoints")
    text = (edited / "config.yaml").read_text()
    (edited / "config.yaml").write_text(text.replace("seed: 0", "seed: 5"))
    res = train("resume=auto", f"hydra.run.dir={edited}", cwd=tmp_path)
    assert res.returncode == 2 and "was edited after the run started" in res.stderr
    for keep in (("checkpoints",), ("checkpoints", ".hydra")):  # a run's checkpoint in a folder without its record
        folder = copy_run(finished_run, tmp_path / "-".join(keep))
        for p in list(folder.iterdir()):
            if p.name not in keep:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        res = train("resume=auto", f"hydra.run.dir={folder}", cwd=tmp_path)
        assert res.returncode == 2 and "holds no record" in res.stderr, res.stderr[-2000:]


def test_the_stale_file_sweep_removes_only_the_temporary_files_of_atomic_writes(train, finished_run, tmp_path):
    run_dir = copy_run(finished_run, tmp_path / "run")
    mine = [run_dir / "eval" / ".notes.tmp.txt", run_dir / ".my.tmp", run_dir / "sub" / ".draft.tmp.md"]
    killed_writer = run_dir / "checkpoints" / ".last.pt.ab_12cd3.tmp.pt"
    for p in mine + [killed_writer]:
        p.parent.mkdir(exist_ok=True)
        p.write_text("x")
    refused = train(*SMOKE, "seed=3", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert refused.returncode == 2 and all(p.exists() for p in mine + [killed_writer])
    from foxdqn.run.folder import RunFolder

    RunFolder(run_dir).open(resume=True).release()
    assert all(p.exists() for p in mine) and not killed_writer.exists()


def test_a_nearly_full_disk_is_refused_before_the_run(tmp_path, monkeypatch):
    from foxdqn.run import folder as run_folder
    from foxdqn.run.folder import RunFolder, RunFolderError

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(run_folder.shutil, "disk_usage", lambda p: usage._replace(free=20 * 1024))
    with pytest.raises(RunFolderError, match=r"0\.0 MiB free, a run needs at least 32 MiB"):
        RunFolder(tmp_path / "run").open()


def test_refusals_name_the_setting_that_chose_the_folder(tmp_path):
    """A single run's folder is chosen by hydra.run.dir, a multirun job's by the sweep's keys: each
    refusal names its own (a basic-launcher sweep's job said hydra.run.dir)."""
    from foxdqn.run.folder import MARKER, RunFolder, RunFolderError

    held = RunFolder(tmp_path / "a").open()
    for key in ("hydra.run.dir", "hydra.sweep.dir or hydra.sweep.subdir"):
        with pytest.raises(RunFolderError, match=f"another run is writing into it .*; wait for it or choose another {key}$"):
            RunFolder(tmp_path / "a", key).open()
    held.release()
    (tmp_path / "a" / MARKER).unlink(missing_ok=True)
    (tmp_path / "a" / "metrics.csv").write_text("step\n")
    with pytest.raises(RunFolderError, match="already holds a run .*; choose another hydra.sweep.dir or hydra.sweep.subdir"):
        RunFolder(tmp_path / "a", "hydra.sweep.dir or hydra.sweep.subdir").open()


def test_prices_beyond_the_accounting_range_are_refused(tmp_path):
    from foxdqn.data import DataConfig, load_market_data
    from foxdqn.data.synthetic import make_martingale_ohlcv

    frame = make_martingale_ohlcv(400, vol_per_bar=1e-3, substeps=4, seed=0, freq="1h", start="2017-01-02")
    for scale in (1e300, 1e-300):
        scaled = frame.copy()
        scaled[["open", "high", "low", "close"]] *= scale
        path = tmp_path / "bars.csv"
        scaled.to_csv(path, index=False)
        with pytest.raises(DataError, match=r"bars\.csv.*'open' has a price of .*row 1.*must lie in \[1e-12, 1e\+12\]"):
            load_market_data(DataConfig(path=str(path)), window=8)


@pytest.mark.slow
def test_evaluate_writes_beside_a_checkpoint_that_is_not_in_its_own_run(cli, finished_run, tmp_path):
    loose = tmp_path / "mal" / "x.pt"
    loose.parent.mkdir()
    shutil.copy(finished_run / "checkpoints" / "last.pt", loose)
    other = copy_run(finished_run, tmp_path / "other", killed=False)
    (other / "config.yaml").write_text((other / "config.yaml").read_text().replace(
        "# foxdqn run ", "# foxdqn run " + "0" * 32 + " was ", 1))  # another run's record: another id
    foreign = other / "checkpoints" / "foreign.pt"
    shutil.copy(finished_run / "checkpoints" / "last.pt", foreign)
    for ckpt, expected in ((loose, loose.parent / "evaluations"), (foreign, foreign.parent / "evaluations"),
                           (other / "checkpoints" / "last.pt", other / "checkpoints" / "evaluations")):
        res = cli("foxdqn.evaluate", [f"checkpoint={ckpt}"], cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-2000:]
        assert (expected / f"{ckpt.stem}_test" / "summary.json").is_file(), ckpt
    assert not (tmp_path / "evaluations").exists() and not (other / "evaluations").exists()
