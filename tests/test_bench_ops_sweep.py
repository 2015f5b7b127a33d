"""bench/ops_sweep.py on CPU (ops in Triton's interpreter, timing replaced by a counter): every
combination of an op's constants runs its bench rows with the constants set on the op module (the
op's own rows only, not another provider's), a combination that cannot launch has no times and is
not ranked, the constants come back after, and the summary
ranks combinations by their worst kernel/compile ratio; unknown ops are refused."""
from __future__ import annotations

import pytest

import bench.ops_sweep as sweep_mod
import bench.ops.bench_dueling_combine as bm
import foxdqn.ops.dueling_combine as dc


def test_sweep_sets_restores_and_ranks(monkeypatch):
    from bench.ops import common

    seen = []

    def fake_bench_all(fns):
        seen.append((dc.TILE, dc.NUM_WARPS))
        if dc.TILE == 7:  # a combination that cannot launch
            return {name: RuntimeError("out of resource") for name in fns}
        us = 1e-3 * (2.0 if dc.TILE == 512 else 1.0)  # ms: the 512 tile "slower"
        # only the op under sweep runs (at the swept tile); torch.compile's rows would only cost time
        return {name: ((fn() if name == "triton" else None), (us, us, us, "fake"))[1] for name, fn in fns.items()}

    monkeypatch.setattr(common, "bench_all", fake_bench_all)
    real_rows = bm.rows

    def rows_with_another_provider(device):  # as bench_q_forward's modules row: not the op, not kept
        out = real_rows(device)
        return out + [dict(r, provider="modules", ms=9.0) for r in out if r["provider"] == "triton"]

    monkeypatch.setattr(bm, "rows", rows_with_another_provider)
    monkeypatch.setitem(sweep_mod.SWEEPS, "dueling_combine", {"TILE": [256, 512, 7], "NUM_WARPS": [1]})
    before = (dc.TILE, dc.NUM_WARPS)
    res = sweep_mod.sweep("dueling_combine", device="cpu")
    assert (dc.TILE, dc.NUM_WARPS) == before
    assert {(256, 1), (512, 1)} <= set(seen)
    cfgs = {c["cfg"]["TILE"]: c for c in res["configs"]}
    assert set(cfgs) == {256, 512, 7}
    assert all(v == 1.0 for v in cfgs[256]["us"].values()) and all(v == 2.0 for v in cfgs[512]["us"].values())
    assert cfgs[7]["us"] == {}  # no time for any size
    lines = sweep_mod.summary("dueling_combine", res)
    assert lines[0] == "== dueling_combine" and "(1.0, {'TILE': 256" in lines[-1]
    assert lines[-1].index("'TILE': 256") < lines[-1].index("'TILE': 512") and "'TILE': 7" not in lines[-1]


def test_unknown_op_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        sweep_mod.main(["no_such_op"])
    assert exc.value.code == 2 and "unknown ops ['no_such_op']" in capsys.readouterr().err
