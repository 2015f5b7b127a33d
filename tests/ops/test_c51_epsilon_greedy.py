"""foxdqn.ops.c51_epsilon_greedy: the kernel (TRITON_INTERPRET=1 on CPU) gives the reference's
actions wherever the reference's expected Q has a clear argmax (plain and dueling heads, P = 1 and
odd P, odd rows and atoms, A = 1, a width of 1), ε = 1 gives u's random actions and ε = 0 Q's
argmax, a NaN row picks action 0 and leaves the other rows, a member's actions do not depend on the
other members, bad arguments raise; MemberC51Network acts through it inside cpu_kernels only and
gives its own forward's ε-greedy actions."""
from __future__ import annotations

import pytest
import torch

from foxdqn.ops.c51_epsilon_greedy import c51_epsilon_greedy, c51_expected_q_reference
from foxdqn.ops.member_uniform import randint_from_uniform

from head_act_cases import (assert_network_acts_through_its_op, assert_widest_case_equals_reference, clear_rows,
                            schedule)


def _case(members, rows, width, actions, atoms, dueling, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.relu(torch.randn(members, rows, width, generator=g))
    outs = ([atoms] if dueling else []) + [actions * atoms]
    ws = [torch.randn(members, width, o, generator=g) / width ** 0.5 for o in outs]
    bs = [0.1 * torch.randn(members, 1, o, generator=g) for o in outs]
    lo = -1.0 - torch.arange(members, dtype=torch.float32)
    support = lo[:, None] + (2 * -lo)[:, None] * torch.arange(atoms) / max(atoms - 1, 1)  # member p: [-1-p, 1+p]
    return h, ws, bs, support


# (P, M, H, A, K, dueling)
SHAPES = [(1, 1, 16, 2, 51, False), (1, 37, 20, 45, 51, True), (3, 19, 9, 5, 7, False), (3, 33, 64, 3, 1, True),
          (5, 17, 1, 1, 3, True), (2, 16, 256, 64, 16, False)]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"P{s[0]}-M{s[1]}-H{s[2]}-A{s[3]}-K{s[4]}-{'duel' if s[5] else 'q'}"
                                               for s in SHAPES])
def test_equals_reference_where_clear(shape):
    members, rows, width, actions, atoms, dueling = shape
    h, ws, bs, z = _case(members, rows, width, actions, atoms, dueling, seed=1)
    sched = schedule(members, rows)
    got = c51_epsilon_greedy(h, ws, bs, z, **sched, backend="triton")
    want = c51_epsilon_greedy(h, ws, bs, z, **sched, backend="torch")
    assert got.dtype == torch.int64 and got.shape == (members * rows,)
    clear = clear_rows(c51_expected_q_reference(h, ws, bs, z))
    if atoms == 1:  # Q = z_0 for every action: all ties, the first action greedy in both
        clear[:] = True
    assert clear.float().mean() > 0.8
    assert torch.equal(got[clear], want[clear])
    assert ((got >= 0) & (got < actions)).all()


@pytest.mark.parametrize("dueling", [False, True])
def test_epsilon_extremes_and_nan_row(dueling):
    h, ws, bs, z = _case(3, 21, 12, 6, 11, dueling, seed=2)
    sched = schedule(3, 21, eps=1.0)
    assert torch.equal(c51_epsilon_greedy(h, ws, bs, z, **sched, backend="triton"),
                       randint_from_uniform(sched["u"][:, 1], 6).reshape(-1))
    h[1, 4, 3] = float("nan")  # member 1's row 4: its logits, hence Q, all NaN → action 0
    sched = schedule(3, 21, eps=0.0)
    got = c51_epsilon_greedy(h, ws, bs, z, **sched, backend="triton").view(3, 21)
    q = c51_expected_q_reference(h, ws, bs, z)
    assert torch.isnan(q[1, 4]).all() and got[1, 4] == 0
    clear = clear_rows(q).view(3, 21)
    clear[1, 4] = False
    assert clear.sum() > 50 and torch.equal(got[clear], q.argmax(dim=2)[clear])


def test_members_never_mix():
    """Member p's actions in a population of 3 are bit for bit a population of one's on its slices;
    changing member 0's weights leaves members 1 and 2 unchanged."""
    h, ws, bs, z = _case(3, 23, 24, 5, 9, True, seed=3)
    sched = schedule(3, 23)
    got = c51_epsilon_greedy(h, ws, bs, z, **sched, backend="triton").view(3, 23)
    for p in range(3):
        one = {k: (v if k == "step" else v[p:p + 1].contiguous()) for k, v in sched.items()}
        alone = c51_epsilon_greedy(h[p:p + 1].contiguous(), [w[p:p + 1] for w in ws], [b[p:p + 1] for b in bs],
                                   z[p:p + 1], **one, backend="triton")
        assert torch.equal(got[p], alone)
    ws2 = [w.clone() for w in ws]
    ws2[1][0] = -ws2[1][0]
    moved = c51_epsilon_greedy(h, ws2, bs, z, **sched, backend="triton").view(3, 23)
    assert torch.equal(moved[1:], got[1:]) and not torch.equal(moved[0], got[0])


BAD = [
    (lambda a: a.update(h=a["h"][:, :, :1].expand(3, 11, 8)), r"c51_epsilon_greedy: h must be a contiguous float32"),
    (lambda a: a.update(support=a["support"][:2]), r"c51_epsilon_greedy: support must be a float32 \[3, K\]"),
    (lambda a: a.update(weights=a["weights"][1:], biases=a["biases"][1:], support=a["support"][:, :3]),
     r"c51_epsilon_greedy: the last weight's outputs must be A·K \(K = 3"),
    (lambda a: a.update(weights=[a["weights"][0][:, :, :3], a["weights"][1]]),
     r"c51_epsilon_greedy: weights\[0\] must be a float32 \[3, 8, out\] tensor on cpu \(W_v: out = K = 5\)"),
    (lambda a: a.update(start=a["start"][:1].clone(), end=a["end"][:1].clone(), duration=a["duration"][:1].clone()),
     r"c51_epsilon_greedy: start, end and duration must hold one schedule per member \(G = P = 3\), got G = 1"),
    (lambda a: a.update(u=a["u"][:, :, :-1].contiguous()), r"c51_epsilon_greedy: u must be a contiguous float32"),
]


@pytest.mark.parametrize("change,match", BAD)
def test_bad_arguments(change, match):
    h, ws, bs, z = _case(3, 11, 8, 4, 5, True)
    args = dict(h=h, weights=ws, biases=bs, support=z, **schedule(3, 11))
    change(args)
    with pytest.raises(ValueError, match=match):
        c51_epsilon_greedy(**args, backend="triton")


@pytest.mark.parametrize("dueling", [False, True])
def test_member_network_acts_through_it(dueling):
    """MemberC51Network.fused_epsilon_greedy: None outside cpu_kernels; inside, the actions of
    epsilon_greedy on the network's own expected Q wherever its argmax is clear."""
    from foxdqn.nn.c51 import C51Head, C51Network
    from foxdqn.nn.mlp import MLPEncoder
    from foxdqn.population.distributional import MemberC51Network

    nets = []
    for seed in range(3):
        torch.manual_seed(seed)
        nets.append(C51Network(MLPEncoder(7, [16, 12]), C51Head(12, 5, atoms=11, v_min=-1.0 - seed, v_max=2.0,
                                                                       dueling=dueling)))
    net = MemberC51Network.from_networks(nets, "relu")
    assert_network_acts_through_its_op(net, torch.randn(3, 29, 7, generator=torch.Generator().manual_seed(5)), 5)


@pytest.mark.gpu
@pytest.mark.parametrize("dueling", [False, True])
def test_compiled_kernel_at_the_widest_shapes_matches_the_reference_on_cuda(dueling):
    """H = MAX_WIDTH, A = MAX_ACTIONS, K = MAX_ATOMS compile within the GPU's shared memory and give
    the reference's actions."""
    from foxdqn.ops.c51_epsilon_greedy import MAX_ACTIONS, MAX_ATOMS, MAX_WIDTH

    case = _case(2, 40, MAX_WIDTH, MAX_ACTIONS, MAX_ATOMS, dueling, seed=3)
    assert_widest_case_equals_reference(c51_epsilon_greedy, c51_expected_q_reference, case, "cuda")


def test_widest_shapes_equal_the_reference():
    """H = MAX_WIDTH, A = MAX_ACTIONS, K = MAX_ATOMS (CPU: recorded for tests/compile_kernels.py,
    which checks that the compiled kernel fits the GPU's shared memory at these widths)."""
    from foxdqn.ops.c51_epsilon_greedy import MAX_ACTIONS, MAX_ATOMS, MAX_WIDTH

    case = _case(1, 3, MAX_WIDTH, MAX_ACTIONS, MAX_ATOMS, True, seed=3)
    assert_widest_case_equals_reference(c51_epsilon_greedy, c51_expected_q_reference, case)