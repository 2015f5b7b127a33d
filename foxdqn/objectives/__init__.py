"""Training objectives: one loss class per algorithm."""
from foxdqn.objectives.base import LossOutput, Objective
from foxdqn.objectives.dqn import DQNObjective, double_dqn_target

__all__ = ["LossOutput", "Objective", "DQNObjective", "double_dqn_target"]
