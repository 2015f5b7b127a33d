"""grad_norm_coefficient: Triton kernel (TRITON_INTERPRET=1 on CPU) vs torch reference vs
torch.nn.utils.clip_grad_norm_ on odd sizes (1 to 4097 elements, 1 to 10 tensors: more than one
launch holds), empty tensors, NaN/Inf/zero gradients; members=3 = three single-member calls bit for
bit; deterministic; every member's ticket back at 0 (members finish on their own counters); argument checks. GPU: kernel vs reference on CUDA,
captured in a CUDA graph = eager (and after changing max_norm in place), no host sync."""
import pytest
import torch

from foxdqn.ops import backend as B
import foxdqn.ops.grad_norm as gn
from foxdqn.ops.grad_norm import grad_norm_coefficient
from foxdqn.ops.tensor_list import MAX_SLOTS, member_chunks

from support import (MULTI_TENSOR_SHAPES, assert_close_report, capture_graph, no_host_sync, randn_list,
                     require_compiled_kernels, torch_clip)

_need_compiled = require_compiled_kernels(B.INTERPRET)
F32 = torch.float32
NAN, INF = float("nan"), float("inf")

SHAPES = {**MULTI_TENSOR_SHAPES, "all_empty": [(0,), (0,)]}  # all empty: total 0, coef 1, no partial row read


_grads = randn_list


@pytest.mark.parametrize("shapes", list(SHAPES))
@pytest.mark.parametrize("max_norm", [1.0, 1e6, 1e-7])
def test_kernel_reference_and_torch_agree(shapes, max_norm):
    grads = _grads(SHAPES[shapes], seed=len(shapes))
    bound = torch.tensor(max_norm)
    kt, kc = grad_norm_coefficient(grads, bound, backend="triton")
    rt, rc = grad_norm_coefficient(grads, bound, backend="torch")
    tt, _ = torch_clip(grads, max_norm)
    assert kt.shape == kc.shape == () and kt.dtype == kc.dtype == F32
    assert_close_report(kt, rt, rtol=4e-7, name="total kernel vs reference")
    assert_close_report(kt, tt, rtol=4e-7, name="total kernel vs clip_grad_norm_")
    assert_close_report(kc, rc, rtol=4e-7, name="coef")
    expect = min(1.0, max_norm / (float(tt) + 1e-6))
    assert_close_report(kc, torch.tensor(expect, dtype=F32), rtol=1e-6, name="coef vs clip rule")
    assert not gn._tickets(torch.device("cpu"), 1).any()  # every member's counter reset
    again = grad_norm_coefficient(grads, bound, backend="triton")
    assert torch.equal(again[0], kt) and torch.equal(again[1], kc)  # deterministic


def test_members_equal_separate_calls_bit_for_bit():
    shapes = SHAPES["ten_with_empty"]
    grads = _grads(shapes, seed=3, members=3)
    grads[4][2, 1, 0] = 50.0  # members differ in size
    bound = torch.tensor([0.5, 1e9, 2.0])
    total, coef = grad_norm_coefficient(grads, bound, members=3, backend="triton")
    rt, rc = grad_norm_coefficient(grads, bound, members=3, backend="torch")
    assert total.shape == coef.shape == (3,)
    for p in range(3):
        t1, c1 = grad_norm_coefficient([g[p] for g in grads], bound[p], backend="triton")
        assert torch.equal(total[p], t1) and torch.equal(coef[p], c1), p
    assert_close_report(total, rt, rtol=4e-7, name="total")
    assert_close_report(coef, rc, rtol=4e-7, name="coef")
    assert float(coef[1]) == 1.0 and float(coef[0]) < 1.0


@pytest.mark.parametrize("shapes", [[(3, 700), (5,), (2000,)], [(1,)] * (MAX_SLOTS + 2), [(9,)] * MAX_SLOTS + [(0,)]],
                         ids=["one_launch", "two_launches", "last_launch_empty"])
def test_members_finish_on_their_own_tickets(shapes):
    """Five members (members in the middle of the counters array, several programs each): every
    member's total equals its own call's bits, each counter is back at 0 afterwards; also when a
    second launch holds the last tensors, and when the last launch's tensors are all empty (one
    program per member finishes it, no ticket)."""
    grads = _grads(shapes, seed=7, members=5)
    bound = torch.tensor([0.5, 1e9, 2.0, 1.0, 3.0])
    gn._tickets(torch.device("cpu"), 64)  # a counter array longer than P
    total, coef = grad_norm_coefficient(grads, bound, members=5, backend="triton")
    assert not gn._tickets(torch.device("cpu"), 5).any()
    rt, rc = grad_norm_coefficient(grads, bound, members=5, backend="torch")
    assert_close_report(total, rt, rtol=4e-7, name="total")
    assert_close_report(coef, rc, rtol=4e-7, name="coef")
    for p in range(5):
        t1, c1 = grad_norm_coefficient([g[p] for g in grads], bound[p], backend="triton")
        assert torch.equal(total[p], t1) and torch.equal(coef[p], c1), p


@pytest.mark.parametrize("programs,max_rows", [(1, 8), (1, 3), (4, 2), (6, 1)])
@pytest.mark.parametrize("shapes", [[(3, 700), (5,), (2000,), (0,), (1025,)], [(9,)] * (MAX_SLOTS + 3)],
                         ids=["one_launch", "two_launches"])
def test_rows_per_program_do_not_change_the_bits(monkeypatch, programs, max_rows, shapes):
    """Several rows per program (member-major chunks: C programs of G rows per member, the last
    program of a member with rows past its end) give the bits of one row per program: the
    partials are stored by row, so neither C nor G enters the sum."""
    grads = _grads(shapes, seed=11, members=3)
    bound = torch.tensor([0.5, 1e9, 2.0])
    want = grad_norm_coefficient(grads, bound, members=3, backend="triton")  # PROGRAMS: one row per program here
    monkeypatch.setattr(gn, "PROGRAMS", programs)
    monkeypatch.setattr(gn, "MAX_ROWS", max_rows)
    got = grad_norm_coefficient(grads, bound, members=3, backend="triton")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not gn._tickets(torch.device("cpu"), 3).any()


def test_member_chunks():
    """C programs per member of G rows: about ``programs`` programs, at most ``max_rows`` rows each,
    never more programs than rows; no rows: one program per member."""
    assert member_chunks(15, 512, 1024, 2) == (8, 2)  # cartpole_cleanrl's 15 rows, 512 members
    assert member_chunks(15, 512, 512, 16) == (1, 15)
    assert member_chunks(120, 1, 1024, 2) == (120, 1)  # one network: a program per row
    assert member_chunks(120, 64, 512, 16) == (8, 15)
    assert member_chunks(7, 3, 1, 3) == (3, 3)  # the last program has 2 rows past the member's 7
    assert member_chunks(0, 5, 1024, 2) == (1, 0)
    with pytest.raises(ValueError, match="member_chunks"):
        member_chunks(3, 0, 1, 1)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_non_finite_and_zero_per_member(backend):
    grads = _grads([(5,), (1000,), (3,)], seed=1, members=4)
    grads[1][0, 17] = NAN  # member 0: NaN
    grads[2][1, 2] = -INF  # member 1: Inf
    grads[0][2, 0] = 3e19  # member 2: a finite value whose square overflows float32
    for g in grads:
        g[3].zero_()  # member 3: all zero
    total, coef = grad_norm_coefficient(grads, torch.tensor([1.0, 1.0, 1.0, 1.0]), members=4, backend=backend)
    assert_close_report(total, torch.tensor([NAN, INF, INF, 0.0]), name="total")
    assert_close_report(coef, torch.tensor([NAN, 0.0, 0.0, 1.0]), name="coef")


def test_one_launch_boundary_and_output_shapes():
    """Exactly MAX_SLOTS tensors (one launch) and MAX_SLOTS + 1 (two); a [1] bound gives [1] outputs."""
    for n in (MAX_SLOTS, MAX_SLOTS + 1):
        grads = _grads([(k + 1,) for k in range(n)], seed=n)
        kt, kc = grad_norm_coefficient(grads, torch.tensor([0.1]), backend="triton")
        rt, rc = grad_norm_coefficient(grads, torch.tensor([0.1]), backend="torch")
        assert kt.shape == kc.shape == (1,)
        assert_close_report(kt, rt, rtol=4e-7, name=f"{n} tensors")
        assert_close_report(kc, rc, rtol=4e-7, name=f"{n} tensors")


def test_argument_errors():
    grads = _grads([(3,)], seed=0)
    with pytest.raises(ValueError, match="grads must be a non-empty list"):
        grad_norm_coefficient([], torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"grads\[1\] must be a contiguous float32"):
        grad_norm_coefficient(grads + [torch.zeros(3, dtype=torch.float64)], torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"grads\[0\] must be .*P = members = 2"):
        grad_norm_coefficient(grads, torch.tensor([1.0, 1.0]), members=2)
    with pytest.raises(ValueError, match="max_norm must be a contiguous torch.float32 tensor"):
        grad_norm_coefficient(grads, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="members must be an int >= 1"):
        grad_norm_coefficient(grads, torch.tensor(1.0), members=0)
    with pytest.raises(ValueError, match="backend must be"):
        grad_norm_coefficient(grads, torch.tensor(1.0), backend="cuda")


@pytest.mark.gpu
def test_gpu_kernel_equals_reference_and_graph_replay():
    shapes = SHAPES["ten_with_empty"] + [(256, 64), (256,), (256, 256)]
    grads = _grads(shapes, seed=5, members=3, device="cuda")
    bound = torch.tensor([0.5, 1e9, 2.0], device="cuda")
    kt, kc = grad_norm_coefficient(grads, bound, members=3)
    rt, rc = grad_norm_coefficient(grads, bound, members=3, backend="torch")
    assert_close_report(kt, rt, rtol=1e-6, name="total")
    assert_close_report(kc, rc, rtol=1e-6, name="coef")
    with no_host_sync():
        graph, (gt, gc) = capture_graph(lambda: grad_norm_coefficient(grads, bound, members=3))
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(gt, kt) and torch.equal(gc, kc)  # captured = eager, bit for bit
    with no_host_sync():
        bound.fill_(1e-3)
        graph.replay()
    et, ec = grad_norm_coefficient(grads, bound, members=3)
    assert torch.equal(gt, et) and torch.equal(gc, ec)
