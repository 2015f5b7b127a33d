"""IQN cosine embedding (Dabney et al. 2018, eq. 4) and the IQN network's fixed policy τ's."""
from __future__ import annotations

import math

import pytest
import torch

from foxdqn.nn.iqn import CosineEmbedding, IQNHead, IQNNetwork
from foxdqn.nn.mlp import MLPEncoder


def test_cosine_embedding_eq4_by_hand():
    # n = 3, H = 2; w (rows j, columns i) = [[1, 2, 3], [-1, 1, 0.5]], b = [0.1, -1]
    emb = CosineEmbedding(3, 2)
    with torch.no_grad():
        emb.linear.weight.copy_(torch.tensor([[1.0, 2.0, 3.0], [-1.0, 1.0, 0.5]]))
        emb.linear.bias.copy_(torch.tensor([0.1, -1.0]))
    r2 = math.sqrt(2.0) / 2
    # τ = 0.25: cos(0) = 1, cos(π/4) = √2/2, cos(π/2) = 0
    #   φ_0 = ReLU(1 + 2·√2/2 + 0 + 0.1) = 1.1 + √2;  φ_1 = ReLU(-1 + √2/2 + 0 - 1) = 0
    # τ = 1/3: cos(0) = 1, cos(π/3) = 0.5, cos(2π/3) = -0.5
    #   φ_0 = ReLU(1 + 1 - 1.5 + 0.1) = 0.6;     φ_1 = ReLU(-1 + 0.5 - 0.25 - 1) = 0
    # τ = 0:   all cosines 1: φ_0 = 6.1, φ_1 = ReLU(0.5 - 1) = 0
    # τ = 1:   cos = [1, -1, 1]: φ_0 = ReLU(1 - 2 + 3 + 0.1) = 2.1, φ_1 = ReLU(-1 - 1 + 0.5 - 1) = 0
    taus = torch.tensor([[0.25, 1 / 3], [0.0, 1.0]])  # (B=2, N=2)
    expected = torch.tensor([[[1.1 + 2 * r2, 0.0], [0.6, 0.0]], [[6.1, 0.0], [2.1, 0.0]]])
    torch.testing.assert_close(emb(taus), expected)
    # a case with φ_1 > 0: w_1 = [2, 0, 0], b_1 = 0 -> φ_1 = 2 for every τ
    with torch.no_grad():
        emb.linear.weight[1] = torch.tensor([2.0, 0.0, 0.0])
        emb.linear.bias[1] = 0.0
    torch.testing.assert_close(emb(taus)[..., 1], torch.full((2, 2), 2.0))


@pytest.mark.parametrize("dueling", [False, True])
def test_forward_is_mean_over_midpoint_quantiles(dueling):
    torch.manual_seed(0)
    net = IQNNetwork(MLPEncoder(5, [8]), IQNHead(8, 3, embedding_dim=6, dueling=dueling), num_quantiles_policy=4)
    torch.testing.assert_close(net.policy_taus, torch.tensor([0.125, 0.375, 0.625, 0.875]))
    obs = torch.randn(7, 5)
    z = net.quantiles(obs, torch.tensor([0.125, 0.375, 0.625, 0.875]).expand(7, 4))
    assert z.shape == (7, 4, 3)
    torch.testing.assert_close(net(obs), z.mean(dim=1))
    assert net.quantiles(obs, torch.rand(7, 11)).shape == (7, 11, 3)


def test_dueling_quantiles_have_zero_mean_advantage():
    torch.manual_seed(1)
    head = IQNHead(4, 3, embedding_dim=5, dueling=True)
    h, taus = torch.randn(2, 4), torch.rand(2, 6)
    z = head(h, taus)
    x = torch.relu(head.hidden(h[:, None, :] * head.embedding(taus)))
    torch.testing.assert_close(z.mean(dim=-1), head.value(x).squeeze(-1))  # mean_a (V + A - mean A) = V


@pytest.mark.parametrize("make, pattern", [
    (lambda: CosineEmbedding(0, 4), r"\bembedding_dim must be an int >= 1, got 0"),
    (lambda: IQNHead(4, 2, embedding_dim=0), r"\bembedding_dim must be an int >= 1, got 0"),
    (lambda: IQNNetwork(MLPEncoder(3, [4]), IQNHead(4, 2), num_quantiles_policy=0),
     r"\bnum_quantiles_policy must be an int >= 1, got 0"),
])
def test_invalid_settings(make, pattern):
    with pytest.raises(ValueError, match=pattern):
        make()
