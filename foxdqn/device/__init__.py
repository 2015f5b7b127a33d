"""Device primitives that kernels, envs, replay and the step build on: device scalars and schedules,
CUDA-graph capture and side streams, captured evaluation chunks, and Triton's cache key computed in
the background at start-up (triton_key.py). docs/design/hot_loop.md."""
