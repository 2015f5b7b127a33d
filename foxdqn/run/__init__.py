"""One run's host side, shared by every member of a population (foxdqn.population.train): the end of
a run (finish.py), checkpoints and resume, the run folder, its MLflow / W&B / Prometheus loggers
(trackers.py), early stopping and a search's pruning."""
