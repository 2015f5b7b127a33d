"""Action modes: how the network's action index maps to the environment's action (``action.mode``)."""
from foxdqn.actions.modes import (
    ACTION_MODES,
    BranchingMode,
    ExposureRoutedMode,
    FactoredMode,
    build_action_mode,
)

__all__ = ["ACTION_MODES", "BranchingMode", "ExposureRoutedMode", "FactoredMode", "build_action_mode"]
