"""Training objectives."""
from foxdqn.objectives.dqn import TDOutput, double_dqn_loss

__all__ = ["TDOutput", "double_dqn_loss"]
