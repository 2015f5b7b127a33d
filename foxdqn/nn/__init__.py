"""Networks: encoders and Q heads."""
from foxdqn.nn.heads import DuelingHead, QHead
from foxdqn.nn.mlp import MLPEncoder
from foxdqn.nn.qnet import QNetwork, build_qnet

__all__ = ["DuelingHead", "QHead", "MLPEncoder", "QNetwork", "build_qnet"]
