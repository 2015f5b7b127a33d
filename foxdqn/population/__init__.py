"""The population path: P agents (members) trained at once, one captured graph per iteration.

Every tensor of the hot loop carries a member axis: weights ``[P, ...]``, the replay's envs
``P × N``, the hyperparameters that may differ between members as ``[P]`` device tensors. Member
p's random draws come from a counter-based generator keyed by its own seed, so member p of a
population equals a population of one with the same seed. docs/design/population.md.
"""
