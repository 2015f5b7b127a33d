"""foxdqn.population.attention on its own (CPU): MemberAttentionEncoder is P AttentionEncoders (odd
shapes, forward and backward), and member p of P is bit for bit a population of one."""
from __future__ import annotations

import copy

import pytest
import torch

from foxdqn.nn.attention import AttentionEncoder
from foxdqn.population.attention import MemberAttentionEncoder


def member_grads(net: torch.nn.Module, p: int) -> dict[str, torch.Tensor]:
    """Member p's parameter gradients in the classic network's state_dict layout."""
    grads = copy.deepcopy(net)
    with torch.no_grad():
        for g, w in zip(grads.parameters(), net.parameters()):
            g.copy_(w.grad)
    return grads.member_state_dict(p)


# --------------------------------------------------------------------------- the encoder alone
W, F, C, HEADS = 7, 3, 12, 3  # odd sizes: 7 tokens of 3 features, 3 heads of 4


def encoders(p, pooling="mean", activation="gelu", seeds=None):
    out = []
    for seed in seeds or range(p):
        torch.manual_seed(seed)
        out.append(AttentionEncoder(W * F + 2, W, F, C, HEADS, 2, pooling=pooling, activation=activation))
    return out


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_member_attention_encoder_is_p_attention_encoders(pooling):
    """Forward and backward of each member equal its AttentionEncoder's (float tolerance), and the
    classic state_dict comes back (same keys, same values)."""
    classic_encoders = encoders(3, pooling)
    net = MemberAttentionEncoder.stack(classic_encoders)
    g = torch.Generator().manual_seed(1)
    obs = torch.randn(3, 5, W * F + 2, generator=g, requires_grad=True)
    grad_out = torch.randn(3, 5, C, generator=g)
    h = net(obs)
    assert h.shape == (3, 5, C)
    h.backward(grad_out)
    grads = member_grads(net, 0), member_grads(net, 1), member_grads(net, 2)
    for p, enc in enumerate(classic_encoders):
        state = net.member_state_dict(p)
        assert state.keys() == enc.state_dict().keys()
        assert all(torch.equal(state[k], v) for k, v in enc.state_dict().items())
        x = obs.detach()[p].clone().requires_grad_(True)
        mine = enc(x)
        torch.testing.assert_close(h[p], mine, rtol=1e-5, atol=1e-6)
        mine.backward(grad_out[p])
        torch.testing.assert_close(obs.grad[p], x.grad, rtol=1e-4, atol=1e-6)
        for k, w in enc.named_parameters():
            torch.testing.assert_close(grads[p][k], w.grad, rtol=1e-4, atol=1e-6, msg=k)


def test_member_attention_encoder_does_not_depend_on_the_population_size():
    """Member 2 of P = 3 and a population of one of its weights: the same bits forward and backward."""
    g = torch.Generator().manual_seed(2)
    obs, grad_out = torch.randn(3, 5, W * F + 2, generator=g), torch.randn(3, 5, C, generator=g)
    results = []
    for seeds in ([0, 1, 2], [2]):
        net = MemberAttentionEncoder.stack(encoders(len(seeds), seeds=seeds))
        x = obs[3 - len(seeds):].clone().requires_grad_(True)
        h = net(x)
        h.backward(grad_out[3 - len(seeds):])
        results.append([h.detach()[-1], x.grad[-1], *(w.grad[-1] for w in net.parameters())])
    for together, alone in zip(*results):
        assert torch.equal(together, alone)


def test_member_attention_encoder_refuses_what_it_cannot_stack():
    with pytest.raises(ValueError, match="one architecture"):
        MemberAttentionEncoder.stack([*encoders(1), *encoders(1, pooling="last")])
    dropped = encoders(2)
    dropped[1].dropout = 0.1
    with pytest.raises(ValueError, match="dropout"):
        MemberAttentionEncoder.stack(dropped)
