"""Benchmark: her_relabel (hindsight relabelling of a sampled batch, one kernel).

Providers: the Triton op, the torch reference, ``torch.compile`` of the reference. Training sizes:
``bitflip_her``'s ring (10 bits, 16 envs per member, 100k transitions per member), batch 128 per
member, 1 and 64 members, obs and s' stacked, each member's γ and reward scale.

Run: ``python -m bench.ops.bench_her_relabel`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, print_table


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.envs.bitflip import BitFlipEnv
    from foxdqn.ops.her_relabel import her_relabel, her_relabel_reference

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    out: list[dict] = []
    bits, batch = 10, 128
    for members in (1, 64):
        n_envs = 16 * members
        t_rows = 100_000 // 16
        env = BitFlipEnv(n_envs, bits, dev, g)
        # episodes of `bits` steps in every env column, the ring wrapped
        episode = (torch.arange(t_rows, device=dev) // bits)[:, None].expand(t_rows, n_envs).contiguous()
        ring_next = torch.randint(0, 2, (t_rows, n_envs, 2 * bits), device=dev, generator=g).float()
        index = torch.randint(0, t_rows * n_envs, (members * batch,), device=dev, generator=g)
        pair = torch.randint(0, 2, (members, 2, batch, 2 * bits), device=dev, generator=g).float()
        obs, next_obs = (pair[0, 0], pair[0, 1]) if members == 1 else (pair[:, 0], pair[:, 1])
        u = torch.rand(members, 2, batch, device=dev, generator=g)
        gamma = torch.full((members,), 0.98, device=dev)
        scale = torch.ones(members, device=dev)
        out += against_compile("bench_her_relabel", "her_relabel", f"P={members} B={batch} bits={bits}",
                               her_relabel, her_relabel_reference, env, episode, torch.tensor(17, device=dev),
                               ring_next, index, obs, next_obs, u, gamma, scale, bits, 0.8, stacked=True)
    return out


if __name__ == "__main__":
    print_table(rows())
