"""A sweep's results: ``python -m foxdqn.report DIR`` (__main__.py) writes report.md, report.json,
report.csv and plots (tables.py, plots.py), the seeds of a setting aggregated (seeds.py) and
walk-forward folds chained (walk_forward.py)."""
