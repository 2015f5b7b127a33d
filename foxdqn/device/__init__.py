"""Device primitives that kernels, envs, replay and the step build on: device scalars and schedules,
CUDA-graph capture and side streams, captured evaluation chunks, and the pinned host ring (its
record layout and reader). docs/design/hot_loop.md, docs/design/ring.md."""
