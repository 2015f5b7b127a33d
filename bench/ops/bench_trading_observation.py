"""Benchmark: trading_observation (the replay's decode of sampled state codes into observations, s
and s' in one kernel).

Providers: the Triton op, the torch reference, ``torch.compile`` of the reference. Training sizes:
``eurusd_dqn``'s batch (``agent.batch_size`` rows) and 4,096 rows, the codes of s and s' of real
states: those ``eurusd_dqn``'s train env (4,096 envs, EURUSD 1h, window 32) returned over a few
random steps, sampled at random.

Run: ``python -m bench.ops.bench_trading_observation`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, print_table
from bench.ops.training import DEFAULT, training


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.trading_observation import trading_observation, trading_observation_reference

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    t = training(DEFAULT, device)
    env = t.env
    code, next_code = [], []
    for _ in range(4):  # a few steps: codes of open positions and of reset envs
        info = env.step(torch.randint(0, env.num_actions, (env.num_envs,), device=dev, generator=g)).info
        code.append(info["state_code"])
        next_code.append(info["next_state_code"])
    code, next_code = torch.cat(code), torch.cat(next_code)
    out: list[dict] = []
    for b in (t.batch_size, 4096):
        index = torch.randint(0, code.shape[0], (b,), device=dev, generator=g)
        codes = (code[index].contiguous(), next_code[index].contiguous())
        out += against_compile("bench_trading_observation", "trading_observation", f"B={b} obs={env.obs_dim} s,s'",
                               trading_observation, trading_observation_reference, codes, None, env._market,
                               env._params, env.obs_dtype)
    return out


if __name__ == "__main__":
    print_table(rows())
