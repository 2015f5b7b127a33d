"""Benchmark: trading_step (one step of the trading env with auto-reset, one kernel).

Providers: the Triton op, the torch reference (the env's step as it was written: about 185
launches on CUDA), ``torch.compile`` of the reference. Training size: ``eurusd_dqn``'s train env at
4,096 envs on the bundled EURUSD 1h bars (window 32), built by the training code
(:func:`foxdqn.step.build.build_env`); random actions and one draw of reset start bars, fixed
across calls. The env's state evolves in place between calls (episodes end and reset), as in
training.

Run: ``python -m bench.ops.bench_trading_step`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, print_table
from bench.ops.training import DEFAULT, training


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.trading_step import trading_step, trading_step_reference

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    env = training(DEFAULT, device).env
    action = torch.randint(0, env.num_actions, (env.num_envs,), device=dev, generator=g)
    starts = env.draw_step()  # the reset start bars of one step ([N] int64, or None)
    size = f"N={env.num_envs} W={env.window} obs={env.obs_dim} {str(env.dtype).removeprefix('torch.')}"
    return against_compile("bench_trading_step", "trading_step", size, trading_step, trading_step_reference,
                           env._state, action, starts, env._market, env._params)


if __name__ == "__main__":
    print_table(rows())
