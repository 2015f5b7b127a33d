"""One run's host side: the loop that replays the captured iteration (loop.py), the end of a run
(finish.py), checkpoints and resume, the run folder, early stopping and a search's pruning."""
