"""Networks: encoders and Q heads."""
from foxdqn.nn.heads import DuelingHead, QHead
from foxdqn.nn.mlp import MLPEncoder
from foxdqn.nn.qnet import QNetwork

__all__ = ["DuelingHead", "QHead", "MLPEncoder", "QNetwork"]
