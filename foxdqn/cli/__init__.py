"""What the command line needs around Hydra: the callbacks registered in conf/train.yaml (callbacks.py),
the GPU placement of parallel jobs (placement.py) and a process exit without the interpreter's
teardown (fast_exit.py)."""
