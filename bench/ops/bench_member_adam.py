"""Benchmark: member_adam_ (one Adam step of one parameter tensor for P population members, one
kernel per tensor).

Timed as the population's optimizer ran it before it moved to :func:`foxdqn.ops.adam_step.adam_step_`
(:class:`foxdqn.population.optim.MemberAdam`, now one launch per 8 tensors): one call per
parameter tensor of the network, all of them per row. Providers: the Triton op, the
torch reference, ``torch.compile`` of the reference (compiled over the whole loop, so it may fuse
across tensors). Training sizes: the parameter shapes of ``eurusd_dqn``'s network (MLP 256, 256,
dueling head, 8 tensors) for 8 and 64 members, and of ``cartpole_cleanrl``'s (6 tensors) for 128
members; ``optim.lr``, ``optim.adam_eps`` and the default betas. Parameters and moments evolve
between calls, as in training.

Run: ``python -m bench.ops.bench_member_adam`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, print_table
from bench.ops.training import CARTPOLE, DEFAULT, training

BETAS = (0.9, 0.999)  # torch.optim.Adam's default, as MemberAdam's


def _every_tensor(op):
    """``op`` applied to each ``(param, grad, exp_avg, exp_avg_sq)`` of the four lists in turn."""

    def run(params, grads, exp_avgs, exp_avg_sqs, step, lr, eps, skip, beta1, beta2, **kwargs):
        for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
            op(p, g, m, v, step, lr, eps, skip, beta1, beta2, **kwargs)

    return run


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.member_adam import member_adam_, member_adam_reference

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    out: list[dict] = []
    for name, members in ((DEFAULT, 8), (DEFAULT, 64), (CARTPOLE, 128)):
        t = training(name, device)
        shapes = [(members, *s) for s in t.param_shapes]
        params = [0.05 * torch.randn(s, device=dev, generator=g) for s in shapes]
        grads = [1e-3 * torch.randn(s, device=dev, generator=g) for s in shapes]
        exp_avgs = [torch.zeros(s, device=dev) for s in shapes]
        exp_avg_sqs = [torch.zeros(s, device=dev) for s in shapes]
        vec = dict(device=dev, dtype=torch.float32)
        args = (params, grads, exp_avgs, exp_avg_sqs, torch.full((members,), 100.0, **vec),
                torch.full((members,), float(t.cfg.optim.lr), **vec),
                torch.full((members,), float(t.cfg.optim.adam_eps), **vec), torch.zeros(members, **vec), *BETAS)
        size = f"{name} P={members} {len(shapes)} tensors {sum(p.numel() for p in params)} values"
        out += against_compile("bench_member_adam", "member_adam_", size, _every_tensor(member_adam_),
                               _every_tensor(member_adam_reference), *args)
    return out


if __name__ == "__main__":
    print_table(rows())
