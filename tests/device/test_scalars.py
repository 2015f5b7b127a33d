"""foxdqn.device.scalars: the constant device tensors are made once per key; is_ones_vector knows the
vectors of ones it made (the tensor itself), not a copy, a view, another value or a plain tensor."""
from __future__ import annotations

import torch

from foxdqn.device.scalars import device_scalar, device_vector, is_ones_vector


def test_same_tensor_per_key():
    assert device_vector("cpu", 3, 0.5) is device_vector(torch.device("cpu"), 3, 0.5)
    assert device_scalar("cpu", 2.0) is device_scalar("cpu", 2.0)
    assert torch.equal(device_vector("cpu", 3, 0.5), torch.full((3,), 0.5))


def test_is_ones_vector_knows_its_own_ones_only():
    ones = device_vector("cpu", 5, 1.0)
    assert is_ones_vector(ones) and is_ones_vector(device_vector("cpu", 5, 1.0))
    assert not is_ones_vector(torch.ones(5)) and not is_ones_vector(ones.clone()) and not is_ones_vector(ones[:4])
    assert not is_ones_vector(ones.view(5)) and not is_ones_vector(device_vector("cpu", 5, 0.5))
    assert not is_ones_vector(device_scalar("cpu", 1.0)) and not is_ones_vector(None)
