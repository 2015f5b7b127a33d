"""Device primitives that kernels, envs, replay and the step build on: device scalars and schedules,
CUDA-graph capture and side streams, and captured evaluation chunks. docs/design/hot_loop.md."""
