"""What a training step is built from: config → env, network and replay storage (build.py), acting
(act.py), magnitude pruning of one network (pruning.py) and the training iteration (iteration.py:
T collect steps and K updates, captured in a CUDA graph). The steps themselves are the
population's (foxdqn.population.step)."""
