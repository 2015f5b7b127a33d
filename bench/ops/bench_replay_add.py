"""Benchmark: replay_add (one time row of the replay ring, its counters and the rollout's next
observations, one kernel).

Providers: the Triton op, the torch reference (the buffer's former ``add``: about 15 launches),
``torch.compile`` of the reference. Training sizes, as :meth:`foxdqn.replay.buffer.ReplayBuffer.add`
calls it: ``eurusd_dqn`` at 4,096 envs (the ring stores the env's 4-value state codes, 100k
transitions; the rollout's observations of 162 values advance in the same launch) and
``cartpole_cleanrl`` (10 envs, 4-value observations, 10k transitions; the rollout is the stored
``obs`` itself). Each call writes the next row: the ring pointer wraps, as in training.

Run: ``python -m bench.ops.bench_replay_add`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from functools import partial

from bench.ops.common import against_compile, print_table
from bench.ops.training import CARTPOLE, DEFAULT, training


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.replay_add import replay_add, replay_add_reference

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    out: list[dict] = []
    for name in (DEFAULT, CARTPOLE):
        t = training(name, device)
        n, num_rows = t.num_envs, t.cfg.replay.capacity // t.num_envs
        codes = getattr(t.env, "code_dim", None) is not None  # trading: the ring stores state codes
        d, dtype = (t.env.code_dim, t.env.code_dtype) if codes else (t.obs_dim, torch.float32)
        f32 = dict(device=dev, dtype=torch.float32)
        buffers = {"obs": torch.zeros(num_rows, n, d, device=dev, dtype=dtype),
                   "next_obs": torch.zeros(num_rows, n, d, device=dev, dtype=dtype),
                   "action": torch.zeros(num_rows, n, dtype=torch.int64, device=dev),
                   "reward": torch.zeros(num_rows, n, **f32), "terminal": torch.zeros(num_rows, n, **f32),
                   "ended": torch.zeros(num_rows, n, **f32),
                   "episode": torch.zeros(num_rows, n, dtype=torch.int64, device=dev), "vol_ratio": None}
        obs = torch.randn(n, d, device=dev, generator=g).to(dtype)
        advance = torch.randn(n, t.obs_dim, device=dev, generator=g)
        rollout = torch.zeros(n, t.obs_dim, **f32) if codes else obs  # the rollout's observations
        args = (obs, torch.randn(n, d, device=dev, generator=g).to(dtype),
                torch.randint(0, t.num_actions, (n,), device=dev, generator=g), torch.randn(n, **f32),
                torch.ones(1, device=dev, dtype=torch.float64),  # loss.reward_scale as a [G] float64 tensor
                torch.rand(n, device=dev, generator=g) < 0.01, torch.rand(n, device=dev, generator=g) < 0.01,
                buffers, torch.zeros(n, dtype=torch.int64, device=dev), torch.zeros((), dtype=torch.int64, device=dev),
                torch.zeros((), dtype=torch.int64, device=dev))
        kernel = partial(replay_add, ticket=torch.zeros((), dtype=torch.int32, device=dev))  # the reference has none
        size = f"N={n} D={d} rows={num_rows}" + (f" advance {t.obs_dim}" if codes else "")
        out += against_compile("bench_replay_add", "replay_add", size, kernel, replay_add_reference, *args,
                               advance_obs=advance, rollout=rollout)
    return out


if __name__ == "__main__":
    print_table(rows())
