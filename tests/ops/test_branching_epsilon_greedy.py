"""foxdqn.ops.branching_epsilon_greedy: the kernel (TRITON_INTERPRET=1 on CPU) gives the
reference's joint actions wherever the reference's joint Q has a clear argmax (1, 2 and 3 branches,
with and without the value stream, P = 1 and odd P, odd rows, a width of 1, 64 joint actions),
the reference's joint Q is combine_branches' of the branch Q, ε = 1 gives u's random actions and
ε = 0 Q's argmax, a NaN row picks action 0, a member's actions do not depend on the others, bad
arguments raise; MemberBranchingNetwork acts through it inside cpu_kernels only and gives its own
forward's ε-greedy actions."""
from __future__ import annotations

import pytest
import torch

from foxdqn.nn.branching import combine_branches
from foxdqn.ops.branching_epsilon_greedy import branching_epsilon_greedy, branching_q_reference
from foxdqn.ops.member_uniform import randint_from_uniform

from head_act_cases import (assert_network_acts_through_its_op, assert_widest_case_equals_reference, clear_rows,
                            schedule)


def _case(members, rows, width, sizes, dueling, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.relu(torch.randn(members, rows, width, generator=g))
    ws = [torch.randn(members, width, n, generator=g) / width ** 0.5 for n in sizes]
    bs = [0.1 * torch.randn(members, 1, n, generator=g) for n in sizes]
    value = [torch.randn(members, width, 1, generator=g), torch.randn(members, 1, 1, generator=g)] if dueling else []
    return h, ws, bs, value


# (P, M, H, branch sizes, dueling)
SHAPES = [(1, 1, 16, (5, 3, 3), True), (1, 37, 20, (5, 3, 3), False), (3, 19, 9, (4, 2), True),
          (3, 33, 64, (7,), False), (5, 17, 1, (2, 2, 2), True), (2, 16, 256, (4, 4, 4), True)]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"P{s[0]}-M{s[1]}-H{s[2]}-{'x'.join(map(str, s[3]))}-"
                                               f"{'duel' if s[4] else 'q'}" for s in SHAPES])
def test_equals_reference_where_clear(shape):
    members, rows, width, sizes, dueling = shape
    h, ws, bs, value = _case(members, rows, width, sizes, dueling, seed=1)
    sched = schedule(members, rows)
    got = branching_epsilon_greedy(h, ws, bs, value, **sched, backend="triton")
    want = branching_epsilon_greedy(h, ws, bs, value, **sched, backend="torch")
    assert got.dtype == torch.int64 and got.shape == (members * rows,)
    clear = clear_rows(branching_q_reference(h, ws, bs, value))
    assert clear.float().mean() > 0.8
    assert torch.equal(got[clear], want[clear])
    joint = torch.tensor(sizes).prod()
    assert ((got >= 0) & (got < joint)).all()


def test_reference_is_combine_branches():
    h, ws, bs, value = _case(2, 9, 8, (5, 3, 3), True, seed=4)
    v = torch.baddbmm(value[1], h, value[0])
    branch = [v + a - a.mean(dim=-1, keepdim=True) for a in (torch.baddbmm(b, h, w) for w, b in zip(ws, bs))]
    assert torch.equal(branching_q_reference(h, ws, bs, value), combine_branches(branch))


@pytest.mark.parametrize("dueling", [False, True])
def test_epsilon_extremes_and_nan_row(dueling):
    h, ws, bs, value = _case(3, 21, 12, (5, 3, 3), dueling, seed=2)
    sched = schedule(3, 21, eps=1.0)
    assert torch.equal(branching_epsilon_greedy(h, ws, bs, value, **sched, backend="triton"),
                       randint_from_uniform(sched["u"][:, 1], 45).reshape(-1))
    h[1, 4, 3] = float("nan")
    sched = schedule(3, 21, eps=0.0)
    got = branching_epsilon_greedy(h, ws, bs, value, **sched, backend="triton").view(3, 21)
    q = branching_q_reference(h, ws, bs, value)
    assert torch.isnan(q[1, 4]).all() and got[1, 4] == 0
    clear = clear_rows(q).view(3, 21)
    clear[1, 4] = False
    assert clear.sum() > 50 and torch.equal(got[clear], q.argmax(dim=2)[clear])


def test_members_never_mix():
    h, ws, bs, value = _case(3, 23, 24, (5, 3, 3), True, seed=3)
    sched = schedule(3, 23)
    got = branching_epsilon_greedy(h, ws, bs, value, **sched, backend="triton").view(3, 23)
    for p in range(3):
        one = {k: (v if k == "step" else v[p:p + 1].contiguous()) for k, v in sched.items()}
        alone = branching_epsilon_greedy(h[p:p + 1].contiguous(), [w[p:p + 1] for w in ws], [b[p:p + 1] for b in bs],
                                         [t[p:p + 1] for t in value], **one, backend="triton")
        assert torch.equal(got[p], alone)
    ws2 = [w.clone() for w in ws]
    ws2[0][0] = -ws2[0][0]
    moved = branching_epsilon_greedy(h, ws2, bs, value, **sched, backend="triton").view(3, 23)
    assert torch.equal(moved[1:], got[1:]) and not torch.equal(moved[0], got[0])


BAD = [
    (lambda a: a.update(h=a["h"].double()), r"branching_epsilon_greedy: h must be a contiguous float32"),
    (lambda a: a.update(branches=a["branches"] * 2, branch_biases=a["branch_biases"] * 2),
     r"branching_epsilon_greedy: branches and branch_biases must be lists of 1 to 3 tensors"),
    (lambda a: a.update(branches=[torch.zeros(3, 8, 9)] * 2, branch_biases=[torch.zeros(3, 1, 9)] * 2),
     r"branching_epsilon_greedy: the joint actions Π n_d must be at most 64, got 81"),
    (lambda a: a.update(value=[a["value"][0].expand(3, 8, 2), a["value"][1]]),
     r"branching_epsilon_greedy: value\[0\] must be a float32 \[3, 8, out\]"),
    (lambda a: a.update(start=a["start"][:1].clone(), end=a["end"][:1].clone(), duration=a["duration"][:1].clone()),
     r"branching_epsilon_greedy: start, end and duration must hold one schedule per member \(G = P = 3\), got G = 1"),
]


@pytest.mark.parametrize("change,match", BAD)
def test_bad_arguments(change, match):
    h, ws, bs, value = _case(3, 11, 8, (5, 3, 3), True)
    args = dict(h=h, branches=ws, branch_biases=bs, value=value, **schedule(3, 11))
    change(args)
    with pytest.raises(ValueError, match=match):
        branching_epsilon_greedy(**args, backend="triton")


@pytest.mark.parametrize("dueling", [False, True])
def test_member_network_acts_through_it(dueling):
    from foxdqn.nn.branching import BranchingHead, BranchingNetwork
    from foxdqn.nn.mlp import MLPEncoder
    from foxdqn.population.branching import MemberBranchingNetwork

    nets = []
    for seed in range(3):
        torch.manual_seed(seed)
        nets.append(BranchingNetwork(MLPEncoder(7, [16, 12]), BranchingHead(12, (5, 3, 3), dueling=dueling)))
    net = MemberBranchingNetwork.from_networks(nets, "relu")
    assert_network_acts_through_its_op(net, torch.randn(3, 29, 7, generator=torch.Generator().manual_seed(5)), 45)


@pytest.mark.gpu
@pytest.mark.parametrize("dueling", [False, True])
def test_compiled_kernel_at_the_widest_shapes_matches_the_reference_on_cuda(dueling):
    """H = MAX_WIDTH, MAX_BRANCHES branches of MAX_ACTIONS joint actions compile within the GPU's
    shared memory and give the reference's actions."""
    from foxdqn.ops.branching_epsilon_greedy import MAX_WIDTH

    case = _case(2, 40, MAX_WIDTH, (4, 4, 4), dueling, seed=3)
    assert_widest_case_equals_reference(branching_epsilon_greedy, branching_q_reference, case, "cuda")


def test_widest_shapes_equal_the_reference():
    """H = MAX_WIDTH, three branches of 4 (CPU: recorded for tests/compile_kernels.py, which checks
    that the compiled kernel fits the GPU's shared memory at these widths)."""
    from foxdqn.ops.branching_epsilon_greedy import MAX_WIDTH

    case = _case(1, 3, MAX_WIDTH, (4, 4, 4), True, seed=3)
    assert_widest_case_equals_reference(branching_epsilon_greedy, branching_q_reference, case)