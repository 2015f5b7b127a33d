"""foxdqn.ops.c51_expected_q: the kernel (TRITON_INTERPRET=1 on CPU) equals the reference (torch's
softmax, product and sum, after the dueling combine) to a few ulps: plain and dueling heads, P = 1
and odd P, odd rows, A = 1, K = 1, eurusd's 45 actions × 51 atoms, the widest tile, logits of
±1e4 (the maximum subtracted), adv and value at strides of their own; the reference is what
MemberC51Network computed before; a NaN logit makes its action's Q NaN (and the row's with the
dueling head), other rows unchanged; members never mix; the head's biases added in the kernel equal
biased inputs bit for bit; bad arguments and an input that needs a gradient raise; no rows (MemberC51Network's forward: tests/population/test_population_kernels.py). GPU (`gpu` marker): the kernel equals the reference, one launch, capture = eager."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.c51_expected_q import MAX_TILE, c51_expected_q, c51_expected_q_reference, c51_expected_q_supported

from support import assert_replay_equals_eager, require_compiled_kernels

_need_compiled = require_compiled_kernels(INTERPRET)


def _case(members, rows, actions, atoms, dueling, scale=3.0, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    adv = scale * torch.randn(members, rows, actions, atoms, generator=g)
    value = scale * torch.randn(members, rows, atoms, generator=g) if dueling else None
    lo = -1.0 - torch.arange(members, dtype=torch.float32)
    support = lo[:, None] + (2 * -lo)[:, None] * torch.arange(atoms) / max(atoms - 1, 1)  # member p: [-1-p, 1+p]
    move = (lambda t: None if t is None else t.to(device))
    return move(adv), move(value), move(support)


def _kernel(adv, value, support):
    return c51_expected_q(adv, value, support, backend="triton")


# (P, M, A, K, dueling)
SHAPES = [(1, 1, 2, 51, False), (1, 37, 45, 51, True), (3, 19, 5, 7, False), (3, 13, 3, 1, True),
          (5, 17, 1, 3, True), (2, 9, 45, 51, False), (2, 3, 64, 256, True), (1, 4, 1, 1, False)]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"P{s[0]}-M{s[1]}-A{s[2]}-K{s[3]}-{'duel' if s[4] else 'q'}"
                                               for s in SHAPES])
def test_equals_reference(shape):
    members, rows, actions, atoms, dueling = shape
    adv, value, support = _case(members, rows, actions, atoms, dueling, seed=sum(shape))
    got = _kernel(adv, value, support)
    assert got.shape == (members, rows, actions) and got.is_contiguous() and got.dtype == torch.float32
    torch.testing.assert_close(got, c51_expected_q_reference(adv, value, support), rtol=1e-5, atol=2e-6)
    if actions > 1 and atoms > 1:
        assert got.std() > 0.05  # not a constant: the atoms' weights differ per action


def test_reference_is_the_member_networks_former_q():
    """The reference is MemberC51Network's expected Q of its logits: v + adv − mean_a adv, then
    (softmax · z).sum, bit for bit."""
    adv, value, support = _case(2, 5, 4, 11, True, seed=3)
    logits = value[:, :, None, :] + adv - adv.mean(dim=2, keepdim=True)
    want = (F.softmax(logits, dim=-1) * support[:, None, None, :]).sum(dim=-1)
    assert torch.equal(c51_expected_q_reference(adv, value, support), want)


@pytest.mark.parametrize("dueling", [False, True], ids=["q", "duel"])
def test_large_logits_and_strides(dueling):
    """Logits of about ±1e4 (the maximum subtracted before exp), adv a transposed view and value a
    slice: the reference's Q."""
    adv, value, support = _case(3, 11, 6, 13, dueling, scale=1e4, seed=4)
    adv = adv.transpose(2, 3).contiguous().transpose(2, 3)  # strides of its own, same values
    value = None if value is None else torch.cat([value, value], dim=2)[:, :, :13]
    assert not adv.is_contiguous()
    got = _kernel(adv, value, support)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, c51_expected_q_reference(adv, value, support), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dueling", [False, True], ids=["q", "duel"])
def test_nan_logit(dueling):
    """A NaN logit of row 2, action 1: that action's Q NaN (with the dueling head the advantages'
    mean, hence the whole row, NaN); every other row as the reference's."""
    adv, value, support = _case(2, 6, 4, 9, dueling, seed=5)
    adv[1, 2, 1, 3] = float("nan")
    got = _kernel(adv, value, support)
    want = c51_expected_q_reference(adv, value, support)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.isnan(got[1, 2, 1]) and (torch.isnan(got[1, 2]).all() if dueling else not torch.isnan(got[1, 2, 0]))
    ok = ~torch.isnan(want)
    torch.testing.assert_close(got[ok], want[ok], rtol=1e-5, atol=2e-6)


def test_members_never_mix():
    """Member 1's logits, value and support changed (a NaN included): member 0's Q bit for bit."""
    adv, value, support = _case(2, 7, 5, 9, True, seed=6)
    before = _kernel(adv, value, support)[0]
    adv[1].mul_(-2.0)
    value[1, 0, 0] = float("nan")
    support[1].mul_(3.0)
    assert torch.equal(_kernel(adv, value, support)[0], before)


def test_no_rows():
    adv, value, support = _case(2, 0, 3, 5, True)
    got = _kernel(adv, value, support)
    assert got.shape == (2, 0, 3)


BAD = [
    (lambda a: a.update(adv=a["adv"].double()), r"c51_expected_q: adv must be a float32 \[P, M, A, K\] tensor"),
    (lambda a: a.update(adv=a["adv"][0]), r"c51_expected_q: adv must be a float32 \[P, M, A, K\] tensor"),
    (lambda a: a.update(value=a["value"][:, :, :-1]), r"c51_expected_q: value must be None or a float32 \[2, 3, 5\]"),
    (lambda a: a.update(support=a["support"][:1]), r"c51_expected_q: support must be a float32 \[2, 5\] tensor"),
    (lambda a: a.update(adv=torch.zeros(1, 1, 65, 256)),
     r"c51_expected_q: A = 65 actions × K = 256 atoms pad to more than 16384 elements"),
    (lambda a: a.update(adv=a["adv"].requires_grad_(True)), r"c51_expected_q: no gradient"),
]


@pytest.mark.parametrize("members,rows,actions,atoms,dueling", [(3, 5, 4, 7, True), (2, 9, 45, 51, False),
                                                                 (1, 3, 1, 3, True)])
def test_biases_in_the_kernel_equal_biased_inputs(members, rows, actions, atoms, dueling):
    """adv and value without their layers' biases plus ``bias``/``value_bias``: bit for bit the
    kernel's Q of the biased inputs (the same float32 adds on the interpreter), and the reference's."""
    adv, value, support = _case(members, rows, actions, atoms, dueling, seed=7)
    g = torch.Generator().manual_seed(8)
    bias = torch.randn(members, actions * atoms, generator=g)
    value_bias = torch.randn(members, atoms, generator=g) if dueling else None
    got = c51_expected_q(adv, value, support, bias=bias, value_bias=value_bias, backend="triton")
    biased_adv = adv + bias.view(members, 1, actions, atoms)
    biased_value = None if value is None else value + value_bias[:, None, :]
    assert torch.equal(got, _kernel(biased_adv, biased_value, support))
    ref = c51_expected_q(adv, value, support, bias=bias, value_bias=value_bias, backend="torch")
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ref, c51_expected_q_reference(biased_adv, biased_value, support), rtol=0, atol=0)


def test_value_holding_its_bias_takes_the_advantage_bias_alone():
    """``bias`` without ``value_bias`` (the value stream biased by member_linear's kernel): bit for bit
    the kernel's Q of the biased advantages and the value as given, and the reference's."""
    adv, value, support = _case(3, 5, 4, 7, True, seed=9)
    bias = torch.randn(3, 28, generator=torch.Generator().manual_seed(10))
    got = c51_expected_q(adv, value, support, bias=bias, backend="triton")
    biased_adv = adv + bias.view(3, 1, 4, 7)
    assert torch.equal(got, _kernel(biased_adv, value, support))
    torch.testing.assert_close(got, c51_expected_q_reference(biased_adv, value, support), rtol=1e-5, atol=1e-5)


def test_bias_arguments():
    adv, value, support = _case(2, 3, 4, 5, True)
    ok = dict(bias=torch.zeros(2, 20), value_bias=torch.zeros(2, 5))
    assert c51_expected_q_supported(adv, value, support, **ok)
    for bad, match in ((dict(ok, bias=torch.zeros(2, 19)), "bias must be"),
                       (dict(ok, value_bias=torch.zeros(2, 4)), "value_bias must be"),
                       (dict(bias=None, value_bias=torch.zeros(2, 5)), "value_bias needs bias")):
        assert not c51_expected_q_supported(adv, value, support, **bad)
        with pytest.raises(ValueError, match=match):
            c51_expected_q(adv, value, support, backend="torch", **bad)


@pytest.mark.parametrize("change,match", BAD)
def test_bad_arguments(change, match):
    adv, value, support = _case(2, 3, 4, 5, True)
    args = dict(adv=adv, value=value, support=support)
    change(args)
    assert not c51_expected_q_supported(args["adv"], args["value"], args["support"])
    for backend in ("triton", "torch"):
        with pytest.raises(ValueError, match=match):
            c51_expected_q(**args, backend=backend)
    assert MAX_TILE == 16384


GPU_SHAPES = [(1, 4096, 45, 51, False), (64, 256, 45, 51, True), (3, 17, 64, 256, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_gpu_equals_reference_one_kernel_capture(shape):
    from support import cuda_kernels

    members, rows, actions, atoms, dueling = shape
    adv, value, support = _case(members, rows, actions, atoms, dueling, seed=9, device="cuda")
    with torch.no_grad():
        got = c51_expected_q(adv, value, support)
        # float32 rounding of 51-atom softmax sums in another order (on the H200: 2e-5 at most, 27 of 737,280)
        torch.testing.assert_close(got, c51_expected_q_reference(adv, value, support), rtol=1e-4, atol=1e-4)
        n, names = cuda_kernels(lambda: c51_expected_q(adv, value, support))
    assert n == 1 and "c51_expected_q" in names[0], names

    def step():
        with torch.no_grad():
            return c51_expected_q(adv, value, support)

    def change():
        adv.mul_(-0.5)
        support.add_(0.25)

    assert_replay_equals_eager(step, change)
