"""The MLP encoder (Linear + ReLU pairs through foxdqn.ops.linear_relu), the dueling head and the
population's MemberQNetwork (through foxdqn.ops.dueling_combine) equal their old expressions, on
CPU with the fused paths forced (the Triton kernel in the interpreter, torch._addmm_activation):
outputs and every parameter's gradient; state_dict keys and old checkpoints unchanged. GPU (`gpu`
marker): the eurusd_dqn online forward at 4,096 envs in at most 6 kernels."""
from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

import foxdqn.nn.heads as heads_mod
import foxdqn.nn.mlp as mlp_mod
import foxdqn.population.network as pop_mod
from foxdqn.nn.heads import DuelingHead
from foxdqn.nn.mlp import MLPEncoder
from foxdqn.nn.qnet import QNetwork
from foxdqn.ops.dueling_combine import dueling_combine
from foxdqn.ops.linear_relu import linear_relu
from foxdqn.population.network import MemberQNetwork


@pytest.fixture
def fused(monkeypatch):
    """Force the fused paths on CPU tensors (auto picks the references there)."""
    monkeypatch.setattr(mlp_mod, "linear_relu", functools.partial(linear_relu, backend="fused"))
    monkeypatch.setattr(heads_mod, "dueling_combine", functools.partial(dueling_combine, backend="triton"))
    monkeypatch.setattr(pop_mod, "dueling_combine", functools.partial(dueling_combine, backend="triton"))


def _old_forward(net: QNetwork, obs: torch.Tensor) -> torch.Tensor:
    """The network's forward before issue 17: nn.Sequential, then the dueling expression."""
    h = net.encoder.net(obs)
    adv = net.head.advantage(h)
    return net.head.value(h) + adv - adv.mean(dim=1, keepdim=True)


def _grads(net, fn, obs, up):
    net.zero_grad(set_to_none=True)
    q = fn(obs)
    (q * up).sum().backward()
    return q.detach(), {k: p.grad.clone() for k, p in net.named_parameters()}


@pytest.mark.parametrize("b,a,activation", [(1, 3, "relu"), (37, 3, "relu"), (130, 45, "relu"), (37, 1, "tanh")])
def test_network_equals_old_expression(fused, b, a, activation):
    torch.manual_seed(b + a)
    net = QNetwork(MLPEncoder(11, [16, 8], activation), DuelingHead(8, a))
    obs, up = torch.randn(b, 11), torch.randn(b, a)
    q, grads = _grads(net, net, obs, up)
    q_old, grads_old = _grads(net, lambda o: _old_forward(net, o), obs, up)
    torch.testing.assert_close(q, q_old, rtol=1e-6, atol=1e-6)
    assert grads.keys() == grads_old.keys()
    for k in grads:
        torch.testing.assert_close(grads[k], grads_old[k], rtol=1e-5, atol=1e-6, msg=k)


def test_state_dict_keys_and_old_checkpoint():
    torch.manual_seed(0)
    net = QNetwork(MLPEncoder(5, [4, 4]), DuelingHead(4, 3))
    keys = ["encoder.net.0.weight", "encoder.net.0.bias", "encoder.net.2.weight", "encoder.net.2.bias",
            "head.value.weight", "head.value.bias", "head.advantage.weight", "head.advantage.bias"]
    assert list(net.state_dict()) == keys
    old = {k: torch.randn_like(v) for k, v in net.state_dict().items()}  # a checkpoint of the old layout
    net.load_state_dict(old, strict=True)
    assert all(torch.equal(net.state_dict()[k], old[k]) for k in keys)
    assert [type(m) for m in net.encoder.net] == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU]


def test_member_network_equals_old_expression(fused):
    torch.manual_seed(3)
    nets = [QNetwork(MLPEncoder(7, [8, 8]), DuelingHead(8, 3)) for _ in range(3)]
    member = MemberQNetwork.from_networks(nets, "relu")
    obs, up = torch.randn(3, 37, 7), torch.randn(3, 37, 3)
    q, grads = _grads(member, member, obs, up)

    def old(o):
        h = o
        for w, bias in zip(member.weights[:2], member.biases[:2]):
            h = torch.relu(torch.baddbmm(bias, h, w))
        v = torch.baddbmm(member.biases[2], h, member.weights[2])
        adv = torch.baddbmm(member.biases[3], h, member.weights[3])
        return v + adv - adv.mean(dim=2, keepdim=True)

    q_old, grads_old = _grads(member, old, obs, up)
    torch.testing.assert_close(q, q_old, rtol=1e-6, atol=1e-6)
    for k in grads:
        torch.testing.assert_close(grads[k], grads_old[k], rtol=1e-5, atol=1e-6, msg=k)
    for p in range(3):  # member p is classic network p
        torch.testing.assert_close(q[p], _old_forward(nets[p], obs[p]).detach(), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
def test_gpu_eurusd_dqn_online_forward_kernels():
    """Collect-step forward of eurusd_dqn's online network at 4,096 envs without gradients: one
    kernel, q_forward's (was 10, then 6: 2 GEMMs with the bias + ReLU epilogue, the value head's
    bias copy + GEMV, the advantage GEMM, the dueling kernel), equal to the old expression to TF32
    rounding (q_forward rounds the operands to nearest, cuBLAS otherwise); and the update's forward
    + backward of [2B, D] against the old expression."""
    from support import assert_close_ulps, cuda_kernels

    from foxdqn.config.compose import load_config
    from foxdqn.data import load_market_data
    from foxdqn.step.build import build_action_mode, build_env, build_network

    cfg = load_config(["+experiment=eurusd_dqn", "device=cuda", "log.progress=false", "env.num_envs=4096"])
    market = load_market_data(cfg.data, cfg.env.window, cfg.env.episode_length)
    env = build_env(cfg, market, "train", torch.device("cuda"), torch.Generator(device="cuda"))
    net = build_network(cfg, env, build_action_mode(cfg, env).num_actions).cuda()  # a single run's network
    obs = torch.randn(4096, net.encoder.net[0].in_features, device="cuda")
    with torch.no_grad():
        n, names = cuda_kernels(lambda: net(obs))
        n_old, _ = cuda_kernels(lambda: _old_forward(net, obs))
        print("online forward:", n, names, "old:", n_old)
        assert_close_ulps(net(obs), _old_forward(net, obs), rtol=1e-2, ulps=2**15)
    assert n == 1 and "q_forward" in names[0], names
    assert n_old - n >= 4

    batch = torch.randn(2 * cfg.agent.batch_size, obs.shape[1], device="cuda")
    up = torch.randn(batch.shape[0], net.head.advantage.out_features, device="cuda")

    def fwd_bwd(fn):
        return lambda: (fn(batch) * up).sum().backward()

    n_fb, names_fb = cuda_kernels(fwd_bwd(net))
    n_fb_old, _ = cuda_kernels(fwd_bwd(lambda o: _old_forward(net, o)))
    print("online forward + backward:", n_fb, names_fb, "old:", n_fb_old)
    assert n_fb < n_fb_old
    # values in full float32: the run's TF32 matmuls (matmul_precision=high) round the two paths'
    # weight-gradient GEMMs differently, far above the 1e-4 compared here
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        q, grads = _grads(net, net, batch, up)
        q_old, grads_old = _grads(net, lambda o: _old_forward(net, o), batch, up)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.testing.assert_close(q, q_old, rtol=1e-4, atol=1e-5)
    for k in grads:
        torch.testing.assert_close(grads[k], grads_old[k], rtol=1e-4, atol=1e-5, msg=k)
