"""Benchmark: target_weight (the target update's lerp weight and the update counter's advance, one
kernel).

Providers: the Triton op, the torch reference (two launches for Polyak, six for the hard copy,
one for the counter), ``torch.compile`` of the reference. Training settings: ``eurusd_dqn``'s
Polyak τ for a single run (0-d) and a population of 64 members (``[64]``, one launch), and
``cartpole_cleanrl``'s hard copy every ``target.period`` updates; the counter advances every call,
as in :func:`foxdqn.step.update.update_step`.

Run: ``python -m bench.ops.bench_target_weight`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, print_table
from bench.ops.training import CARTPOLE, DEFAULT, training


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.target_weight import target_weight, target_weight_reference

    dev = torch.device(device)
    out: list[dict] = []
    for name, members in ((DEFAULT, None), (DEFAULT, 64), (CARTPOLE, None)):
        target = training(name, device).cfg.target
        hard = target.update == "hard"
        lead = () if members is None else (members,)
        args = (torch.zeros((), dtype=torch.int64, device=dev), torch.zeros(lead, device=dev),
                torch.full(lead, float(target.tau), device=dev),
                torch.full(lead, int(target.period), dtype=torch.int64, device=dev), torch.zeros(lead, device=dev))
        size = f"{'hard' if hard else 'polyak'}" + ("" if members is None else f" G={members}")
        out += against_compile("bench_target_weight", "target_weight", size, target_weight, target_weight_reference,
                               *args, hard=hard, advance=True)
    return out


if __name__ == "__main__":
    print_table(rows())
