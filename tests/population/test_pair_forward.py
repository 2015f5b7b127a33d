"""The online network's rows of s (with gradient) and of s' (constants) in one launch per layer
(foxdqn.ops.member_linear's pair; the MLP chain's split for IQL's V at widths <= 128): encoder_pair,
MemberValueNetwork.forward_pair and MemberC51Network.logit_parts_pair give the values and gradients
of two passes (the second under no_grad), inside cpu_kernels (the kernels of CUDA, on the CPU), for
an MLP wider than the chain's 128 and a narrower one; outside cpu_kernels they are the two passes."""
from __future__ import annotations

import pytest
import torch

from bench.cpu_kernels import launches, small_overrides
from bench.harness import make_population
from foxdqn.ops.backend import cpu_kernels

from support import assert_close_ulps
from test_population import TRADING, assert_member_equal, configs, run


def _population(experiment: str, hidden: str):
    over = [o for o in small_overrides(experiment) if not o.startswith("model.hidden=")]
    return make_population([f"+experiment={experiment}", *over, f"model.hidden={hidden}", "debug.max_hidden=null"], 2,
                           "cpu", fill=False)


def _pair(p: int, b: int, d: int):
    pair = torch.randn(p, 2, b, d, generator=torch.Generator().manual_seed(p * b + d))
    return pair, pair[:, 0], pair[:, 1]


def _check_grads(params, out_pair, out_two):
    """The gradients of Σ out · up w.r.t. params equal between the paired and the two-pass output."""
    up = torch.randn_like(out_two)
    g1 = torch.autograd.grad((out_pair * up).sum(), params, allow_unused=True)
    g2 = torch.autograd.grad((out_two * up).sum(), params, allow_unused=True)
    for a, e in zip(g1, g2):
        assert (a is None) == (e is None)
        if a is not None:
            assert_close_ulps(a, e, rtol=1e-5, ulps=256)


@pytest.mark.parametrize("hidden", ["[16]", "[160]"])
def test_value_pair_equals_two_passes(hidden):
    s = _population("eurusd_iql", hidden)
    v = s.value
    pair, obs, nxt = _pair(2, 5, v.weights[0].shape[1])
    with cpu_kernels():
        a, b = v.forward_pair(obs, nxt, pair)
        n = launches(lambda: v.forward_pair(obs, nxt, pair))
        a2 = v(obs)
        with torch.no_grad():
            b2 = v(nxt)
    assert not b.requires_grad and a.requires_grad and a.shape == b.shape == (2, 5)
    assert_close_ulps(a.detach(), a2.detach(), rtol=1e-5, ulps=256)
    assert_close_ulps(b, b2, rtol=1e-5, ulps=256)
    _check_grads(list(v.parameters()), a, a2)
    layers = len(v.weights)
    assert len(n) == (1 if hidden == "[16]" else layers), n  # the chain's split, else one launch per layer
    plain_a, plain_b = v.forward_pair(obs, nxt, pair)  # outside cpu_kernels: the two passes, the same values
    assert_close_ulps(plain_a.detach(), a2.detach(), rtol=1e-5, ulps=256)


@pytest.mark.parametrize("experiment", ["eurusd_c51", "eurusd_rainbowish"])
def test_c51_logit_parts_pair_equals_two_passes(experiment):
    s = _population(experiment, "[160]")
    net = s.online
    _, obs, nxt = _pair(2, 4, net.weights[0].shape[1])
    with cpu_kernels():
        (va, la), (vb, lb), biases = net.logit_parts_pair(obs, nxt)
        va2, la2, *biases2 = net.logit_parts(obs)
        with torch.no_grad():
            vb2, lb2, *_ = net.logit_parts(nxt)
    assert not lb.requires_grad and la.requires_grad
    for got, want in ((la, la2), (lb, lb2)) + (((va, va2), (vb, vb2)) if net.dueling else ()):
        assert got.shape == want.shape
        assert_close_ulps(got.detach(), want.detach(), rtol=1e-5, ulps=256)
    # the heads' widths (A·K = 45·51, K = 51) take no member kernel: their biases are left to the loss's
    # kernels, views of the parameters; outside cpu_kernels the streams hold them (baddbmm)
    p = net.biases[-1].shape[0]
    assert biases[1] is not None and biases[1].data_ptr() == net.biases[-1].data_ptr()
    assert biases[1].shape == (p, 45 * 51)
    assert [None if b is None else b.data_ptr() for b in biases] == [None if b is None else b.data_ptr() for b in biases2]
    assert (biases[0] is not None) == net.dueling
    biased_v, biased_l, *none = net.logit_parts(obs)
    assert none == [None, None]
    added = la2 + biases[1].view(p, 1, 45, 51)
    assert_close_ulps(biased_l.detach(), added.detach(), rtol=1e-5, ulps=256)
    if net.dueling:
        assert_close_ulps(biased_v.detach(), (va2 + biases[0][:, None, :]).detach(), rtol=1e-5, ulps=256)
    _check_grads(list(net.parameters()), la, la2)


def test_iqn_encoder_pair_equals_two_passes_and_launches_once_per_layer():
    s = _population("eurusd_iqn", "[160]")
    net = s.online
    _, obs, nxt = _pair(2, 4, net.weights[0].shape[1])
    with cpu_kernels():
        ha, hb = net.encoder_pair(obs, nxt)
        n = launches(lambda: net.encoder_pair(obs, nxt))
        ha2 = net.encoder(obs)
        with torch.no_grad():
            hb2 = net.encoder(nxt)
    assert n == ["triton::_member_linear_kernel"] * net.encoder_layers
    assert_close_ulps(ha.detach(), ha2.detach(), rtol=1e-5, ulps=256)
    assert_close_ulps(hb, hb2, rtol=1e-5, ulps=256)
    _check_grads(list(net.parameters()), ha, ha2)


#: (base overrides, the op that must run in the fused update) of each loss that takes the pair
FUSED_MEMBERS = {
    "c51_dueling": ([*TRADING, "head=c51", "head.atoms=11", "head.dueling=true"], "member_linear_pair"),
    "iqn": ([*TRADING, "head=iqn", "head.num_quantiles=8", "head.num_target_quantiles=6",
             "head.num_quantiles_policy=4", "head.embedding_dim=8"], "member_linear_pair"),
    "iql_wide": ([*TRADING, "objective=iql", "model.hidden=[160]", "debug.max_hidden=null"], "member_linear_pair"),
    "iql_chain": ([*TRADING, "objective=iql"], "member_mlp_chain_split"),
}


@pytest.mark.parametrize("case", list(FUSED_MEMBERS))
def test_members_equal_runs_of_one_member_in_the_fused_kernels(case, monkeypatch):
    """Inside cpu_kernels (the CUDA path's kernels in Triton's interpreter) the C51, IQN and IQL
    losses train through the pair (or, for IQL's narrow V, the MLP chain's split): each member still
    equals the population of one of its seed, bit for bit (weights of the online, target and value
    networks after training)."""
    import foxdqn.ops.member_linear as linear_mod
    import foxdqn.population.network as net_mod

    base, op = FUSED_MEMBERS[case]
    calls = []
    module = linear_mod if op == "member_linear_pair" else net_mod
    real = getattr(module, op)
    monkeypatch.setattr(module, op, lambda *a, **k: calls.append(1) or real(*a, **k))
    members = [["seed=5"], ["seed=6", "agent.gamma=0.9", "loss.reward_scale=10"]]
    with cpu_kernels():
        together = run(configs(base, members), iterations=2, collect_first=1)
        assert calls, f"{op} did not run"
        for p, extra in enumerate(members):
            assert_member_equal(together, p, run(configs(base, [extra]), iterations=2, collect_first=1), 0)


@pytest.mark.parametrize("members", [1, 3])
def test_member_products_gradients_equal_autograds_of_two_products(members):
    """Two heads on one input (a dueling C51 head): the outputs are the two bmm's bit for bit, the
    weights' gradients too, and x's gradient (the second GEMM accumulating into the first's
    output) equals autograd's sum of the two to float rounding; with only some inputs needing a
    gradient, only those get one; under no_grad it is the two products."""
    from foxdqn.population.layers import member_product, member_products

    gen = torch.Generator().manual_seed(members)
    x = torch.randn(members, 7, 5, generator=gen)
    w_a, w_b = torch.randn(members, 5, 9, generator=gen), torch.randn(members, 5, 3, generator=gen)
    up_a, up_b = torch.randn(members, 7, 9, generator=gen), torch.randn(members, 7, 3, generator=gen)
    grads = []
    for fused in (True, False):
        leaves = [t.clone().requires_grad_(True) for t in (x, w_a, w_b)]
        y_a, y_b = member_products(*leaves) if fused else (member_product(leaves[0], leaves[1]),
                                                           member_product(leaves[0], leaves[2]))
        ((y_a * up_a).sum() + (y_b * up_b).sum()).backward()
        grads.append([y_a.detach(), y_b.detach()] + [t.grad for t in leaves])
    (ya, yb, gx, gwa, gwb), (ya2, yb2, gx2, gwa2, gwb2) = grads
    assert torch.equal(ya, ya2) and torch.equal(yb, yb2) and torch.equal(gwa, gwa2) and torch.equal(gwb, gwb2)
    torch.testing.assert_close(gx, gx2, rtol=1e-6, atol=1e-6)
    w_only = w_a.clone().requires_grad_(True)
    y_a, y_b = member_products(x, w_only, w_b)
    (y_a.sum() + y_b.sum()).backward()
    assert w_only.grad is not None and torch.equal(w_only.grad, x.transpose(1, 2) @ torch.ones(members, 7, 9))
    with torch.no_grad():
        y_a, y_b = member_products(x, w_a.requires_grad_(True), w_b)
    assert not y_a.requires_grad and torch.equal(y_a, ya)


@pytest.mark.gpu
def test_one_member_linear_on_cuda_is_addmm_with_its_bias_in_the_epilogue():
    """A population of one's layer at a width the member kernel does not take (45 columns): addmm, no
    copy of the bias in the forward (baddbmm: a bias copy and the GEMM), equal to baddbmm to float rounding, forward and
    backward (the bias gradient included)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run `make test-gpu` on a GPU machine)")
    from torch.profiler import ProfilerActivity, profile

    from foxdqn.population.layers import member_linear

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, 256, 64, device="cuda", generator=gen)
    w = torch.randn(1, 64, 45, device="cuda", generator=gen)
    b = torch.randn(1, 1, 45, device="cuda", generator=gen)
    up = torch.randn(1, 256, 45, device="cuda", generator=gen)
    grads = []
    for use_layer in (True, False):
        leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
        y = member_linear(*leaves) if use_layer else torch.baddbmm(leaves[2], leaves[0], leaves[1])
        (y * up).sum().backward()
        grads.append([y.detach()] + [t.grad for t in leaves])
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)  # TF32 products where torch allows them
    with torch.no_grad():
        member_linear(x, w, b)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            member_linear(x, w, b)
            torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.lower().startswith(("memcpy", "memset"))]
    # no copy of the bias (baddbmm's elementwise direct_copy kernel); cuBLASLt may add a split-K reduction
    assert not any("copy" in k for k in kernels) and 1 <= len(kernels) <= 2, kernels
