"""foxdqn.ops.branching_joint_q: the kernel (TRITON_INTERPRET=1 on CPU) against its torch reference
(the population's branch_q and combine_branches) on one to three branches of odd sizes, with and
without dueling, member-major and flat leading shapes, more rows than a program's tile, strided
inputs, a hand-computed case; NaN, no gradient, bad arguments, no rows (a branching population's
forward takes it: tests/population/test_population_actions.py). GPU (`gpu` marker): kernel =
reference on CUDA, a capture replays as eager, one kernel."""
from __future__ import annotations

import pytest
import torch

from foxdqn.ops import branching_joint_q as jq_module
from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.branching_joint_q import branching_joint_q, branching_joint_q_reference

from support import assert_replays_give, cuda_kernels, require_compiled_kernels

_need_compiled = require_compiled_kernels(INTERPRET)


def _case(lead, sizes, dueling=True, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    adv = [(torch.randn(*lead, n, generator=g) * 3).to(device) for n in sizes]
    return adv, ((torch.randn(*lead, 1, generator=g)).to(device) if dueling else None)


@pytest.mark.parametrize("sizes", [(5, 3, 3), (2,), (4, 7), (1, 3, 2), (6, 1, 5)])
@pytest.mark.parametrize("dueling", [True, False], ids=["dueling", "plain"])
@pytest.mark.parametrize("lead", [(1, 1), (3, 7), (2, 129), (33,)])
def test_kernel_equals_reference(sizes, dueling, lead):
    adv, value = _case(lead, sizes, dueling)
    got = branching_joint_q(adv, value, backend="triton")
    want = branching_joint_q_reference(adv, value)
    assert got.shape == want.shape == (*lead, torch.tensor(sizes).prod().item()) and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_many_row_blocks_and_strided_inputs(monkeypatch):
    monkeypatch.setattr(jq_module, "TILE", 64)  # one or two rows a program
    adv, value = _case((3, 11), (5, 3, 3), seed=1)
    strided = [torch.cat([a, a], dim=-1)[..., :a.shape[-1]] for a in adv]  # not contiguous
    assert not strided[0].is_contiguous()
    got = branching_joint_q(strided, value, backend="triton")
    torch.testing.assert_close(got, branching_joint_q_reference(adv, value), rtol=1e-6, atol=1e-6)


def test_hand_computed():
    adv = [torch.tensor([[1.0, 3.0]]), torch.tensor([[0.0, 3.0, 6.0]])]  # means 2 and 3
    value = torch.tensor([[0.5]])  # Q_0 = [-0.5, 1.5], Q_1 = [-2.5, 0.5, 3.5]
    want = torch.tensor([[(q0 + q1) / 2 for q0 in (-0.5, 1.5) for q1 in (-2.5, 0.5, 3.5)]])
    torch.testing.assert_close(branching_joint_q(adv, value, backend="triton"), want)
    plain = torch.tensor([[(q0 + q1) / 2 for q0 in (1.0, 3.0) for q1 in (0.0, 3.0, 6.0)]])
    torch.testing.assert_close(branching_joint_q(adv, None, backend="triton"), plain)


def test_nan_stays_in_its_row():
    adv, value = _case((2, 4), (5, 3, 3))
    adv[1] = adv[1].clone()
    adv[1][1, 2, 0] = float("nan")
    got = branching_joint_q(adv, value, backend="triton")
    assert torch.isnan(got[1, 2]).all()  # dueling: the branch's mean is NaN
    rest = torch.ones(2, 4, dtype=torch.bool)
    rest[1, 2] = False
    assert torch.isfinite(got[rest]).all()


def test_refuses_inputs_that_need_a_gradient_and_bad_arguments():
    adv, value = _case((2, 3), (5, 3, 3))
    with pytest.raises(ValueError, match="no gradient"):
        branching_joint_q([adv[0].requires_grad_(True), *adv[1:]], value, backend="triton")
    with torch.no_grad():
        branching_joint_q(adv, value, backend="triton")  # under no_grad: taken
    adv[0].requires_grad_(False)
    for bad, match in (([], "1 to 3 tensors"), (adv * 2, "1 to 3 tensors"), ([adv[0], adv[1][0]], r"adv\[1\] must be"),
                       ([adv[0].double()], r"adv\[0\] must be float32")):
        with pytest.raises(ValueError, match=match):
            branching_joint_q(bad, value, backend="triton")
    with pytest.raises(ValueError, match="value must be None or float32"):
        branching_joint_q(adv, value[:1], backend="triton")


def test_no_rows():
    adv, value = _case((2, 0), (5, 3, 3))
    assert branching_joint_q(adv, value, backend="triton").shape == (2, 0, 45)


@pytest.mark.gpu
@pytest.mark.parametrize("lead,sizes", [((1, 4096), (5, 3, 3)), ((64, 64), (5, 3, 3)), ((3, 1001), (4, 7))])
def test_gpu_kernel_equals_reference(lead, sizes):
    adv, value = _case(lead, sizes, device="cuda")
    torch.testing.assert_close(branching_joint_q(adv, value), branching_joint_q_reference(adv, value),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_gpu_capture_equals_eager_and_is_one_kernel():
    adv, value = _case((64, 64), (5, 3, 3), device="cuda")

    def step():
        return [branching_joint_q(adv, value)]

    eager = [x.clone() for x in step()]
    assert_replays_give(step, eager)
    _, names = cuda_kernels(step)
    assert names == ["_branching_joint_q_kernel"], names
