"""foxdqn.ops.iqn_epsilon_greedy: the kernel (TRITON_INTERPRET=1 on CPU) gives the reference's
actions wherever the reference's policy Q has a clear argmax (plain and dueling heads, P = 1 and
odd P, odd rows, odd widths and fraction counts, K = 1, A = 1, hidden widths and embedding sizes above
one chunk), the reference is MemberIQNNetwork's policy Q, ε = 1 gives u's random actions and ε = 0 Q's argmax, a
NaN row picks action 0, a member's actions do not depend on the others, bad arguments raise;
MemberIQNNetwork acts through it inside cpu_kernels only and gives its own forward's actions."""
from __future__ import annotations

import math

import pytest
import torch

from foxdqn.ops.iqn_epsilon_greedy import iqn_epsilon_greedy, iqn_policy_q_reference
from foxdqn.ops.member_uniform import randint_from_uniform

from head_act_cases import (assert_network_acts_through_its_op, assert_widest_case_equals_reference, clear_rows,
                            schedule)


def _case(members, rows, emb, width, hidden, actions, fractions, dueling, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.relu(torch.randn(members, rows, width, generator=g))
    dims = [(emb, width), (width, hidden)] + ([(hidden, 1), (hidden, actions)] if dueling else [(hidden, actions)])
    ws = [torch.randn(members, i, o, generator=g) / i ** 0.5 for i, o in dims]
    bs = [0.1 * torch.randn(members, 1, o, generator=g) for _, o in dims]
    pi_i = torch.arange(emb, dtype=torch.float32) * math.pi
    taus = (torch.arange(fractions, dtype=torch.float32) + 0.5) / fractions
    return h, ws, bs, pi_i, taus


# (P, M, n, H, F, A, K, dueling)
SHAPES = [(1, 1, 64, 16, 16, 2, 32, False), (1, 37, 64, 20, 20, 45, 8, True), (3, 19, 7, 9, 9, 5, 3, False),
          (3, 33, 16, 24, 70, 3, 1, True), (5, 17, 1, 1, 1, 1, 2, True), (2, 16, 8, 130, 130, 64, 2, False),
          (2, 9, 130, 24, 24, 5, 3, True)]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"P{s[0]}-M{s[1]}-n{s[2]}-H{s[3]}-F{s[4]}-A{s[5]}-K{s[6]}-"
                                               f"{'duel' if s[7] else 'q'}" for s in SHAPES])
def test_equals_reference_where_clear(shape):
    *dims, dueling = shape
    members, rows, actions = dims[0], dims[1], dims[5]
    h, ws, bs, pi_i, taus = _case(*dims, dueling, seed=1)
    sched = schedule(members, rows)
    got = iqn_epsilon_greedy(h, ws, bs, pi_i, taus, **sched, backend="triton")
    want = iqn_epsilon_greedy(h, ws, bs, pi_i, taus, **sched, backend="torch")
    assert got.dtype == torch.int64 and got.shape == (members * rows,)
    clear = clear_rows(iqn_policy_q_reference(h, ws, bs, pi_i, taus))
    assert clear.float().mean() > 0.8
    assert torch.equal(got[clear], want[clear])
    assert ((got >= 0) & (got < actions)).all()


@pytest.mark.parametrize("dueling", [False, True])
def test_reference_is_the_member_networks_policy_q(dueling):
    from foxdqn.nn.iqn import IQNHead, IQNNetwork
    from foxdqn.nn.mlp import MLPEncoder
    from foxdqn.population.distributional import MemberIQNNetwork

    nets = []
    for seed in range(3):
        torch.manual_seed(seed)
        nets.append(IQNNetwork(MLPEncoder(7, [16, 12]), IQNHead(12, 5, embedding_dim=8, dueling=dueling),
                               num_quantiles_policy=6))
    net = MemberIQNNetwork.from_networks(nets, "relu")
    obs = torch.randn(3, 29, 7, generator=torch.Generator().manual_seed(5))
    e = net.encoder_layers
    with torch.no_grad():
        ref = iqn_policy_q_reference(net.encoder(obs), list(net.weights[e:]), list(net.biases[e:]), net.pi_i,
                                     net.policy_taus)
        assert torch.allclose(ref, net(obs), rtol=1e-5, atol=1e-6)
    assert_network_acts_through_its_op(net, obs, 5)


@pytest.mark.parametrize("dueling", [False, True])
def test_epsilon_extremes_and_nan_row(dueling):
    h, ws, bs, pi_i, taus = _case(3, 21, 8, 12, 12, 6, 4, dueling, seed=2)
    sched = schedule(3, 21, eps=1.0)
    assert torch.equal(iqn_epsilon_greedy(h, ws, bs, pi_i, taus, **sched, backend="triton"),
                       randint_from_uniform(sched["u"][:, 1], 6).reshape(-1))
    h[1, 4, 3] = float("nan")
    sched = schedule(3, 21, eps=0.0)
    got = iqn_epsilon_greedy(h, ws, bs, pi_i, taus, **sched, backend="triton").view(3, 21)
    q = iqn_policy_q_reference(h, ws, bs, pi_i, taus)
    assert torch.isnan(q[1, 4]).all() and got[1, 4] == 0
    clear = clear_rows(q).view(3, 21)
    clear[1, 4] = False
    assert clear.sum() > 50 and torch.equal(got[clear], q.argmax(dim=2)[clear])


def test_members_never_mix():
    h, ws, bs, pi_i, taus = _case(3, 23, 8, 24, 24, 5, 4, True, seed=3)
    sched = schedule(3, 23)
    got = iqn_epsilon_greedy(h, ws, bs, pi_i, taus, **sched, backend="triton").view(3, 23)
    for p in range(3):
        one = {k: (v if k == "step" else v[p:p + 1].contiguous()) for k, v in sched.items()}
        alone = iqn_epsilon_greedy(h[p:p + 1].contiguous(), [w[p:p + 1] for w in ws], [b[p:p + 1] for b in bs],
                                   pi_i, taus, **one, backend="triton")
        assert torch.equal(got[p], alone)
    ws2 = [w.clone() for w in ws]
    ws2[-1][0] = -ws2[-1][0]
    moved = iqn_epsilon_greedy(h, ws2, bs, pi_i, taus, **sched, backend="triton").view(3, 23)
    assert torch.equal(moved[1:], got[1:]) and not torch.equal(moved[0], got[0])


BAD = [
    (lambda a: a.update(h=a["h"][:2]), r"iqn_epsilon_greedy: W_e must be a float32 \[2, 8, out\]"),
    (lambda a: a.update(taus=a["taus"].double()), r"iqn_epsilon_greedy: taus must be a contiguous float32"),
    (lambda a: a.update(weights=a["weights"][:2], biases=a["biases"][:2]),
     r"iqn_epsilon_greedy: weights and biases must be lists of \[W_e, W_h, W_o\]"),
    (lambda a: a.update(weights=[torch.zeros(3, 8, 300)] + a["weights"][1:]),
     r"iqn_epsilon_greedy: W_e must be a float32 \[3, 8, out\] tensor on cpu \(W_e: out = H = 12"),
    (lambda a: a.update(start=a["start"][:1].clone(), end=a["end"][:1].clone(), duration=a["duration"][:1].clone()),
     r"iqn_epsilon_greedy: start, end and duration must hold one schedule per member \(G = P = 3\), got G = 1"),
]


@pytest.mark.parametrize("change,match", BAD)
def test_bad_arguments(change, match):
    h, ws, bs, pi_i, taus = _case(3, 11, 8, 12, 12, 4, 3, True)
    args = dict(h=h, weights=ws, biases=bs, pi_i=pi_i, taus=taus, **schedule(3, 11))
    change(args)
    with pytest.raises(ValueError, match=match):
        iqn_epsilon_greedy(**args, backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("dueling", [False, True])
def test_compiled_kernel_at_the_widest_shapes_matches_the_reference_on_cuda(dueling):
    """The widths the op accepts at their maximum (n, H, F = MAX_WIDTH, A = MAX_ACTIONS; K as
    eurusd_iqn's 32) compile within the GPU's shared memory and give the reference's actions
    (eurusd_iqn's H = F = 256 once needed 244 KiB of it on the H200, above its 227 KiB)."""
    from foxdqn.ops.iqn_epsilon_greedy import MAX_ACTIONS, MAX_WIDTH

    case = _case(2, 40, MAX_WIDTH, MAX_WIDTH, MAX_WIDTH, MAX_ACTIONS, 32, dueling, seed=3)
    assert_widest_case_equals_reference(iqn_epsilon_greedy, iqn_policy_q_reference, case, "cuda")


def test_widest_shapes_equal_the_reference():
    """n, H, F = MAX_WIDTH, A = MAX_ACTIONS, K = 32 (CPU: recorded for tests/compile_kernels.py,
    which checks that the compiled kernel fits the GPU's shared memory at these widths)."""
    from foxdqn.ops.iqn_epsilon_greedy import MAX_ACTIONS, MAX_WIDTH

    case = _case(1, 3, MAX_WIDTH, MAX_WIDTH, MAX_WIDTH, MAX_ACTIONS, 32, True, seed=3)
    assert_widest_case_equals_reference(iqn_epsilon_greedy, iqn_policy_q_reference, case)