"""Benchmark: the update's multi-tensor tail, one launch per 8 tensors: grad_norm_coefficient
(norm and clip coefficient), adam_step_ (Adam with the clip's multiply and the skip) and
target_lerp_ (target weight, lerp, counter).

Providers per op: the Triton op, its torch reference, ``torch.compile`` of the reference (the
bench's rule), and what the run used before: ``torch.nn.utils.clip_grad_norm_`` (norm and the
in-place multiply), ``torch.optim.Adam(fused=True, capturable=True)`` with ``found_inf`` (and the
clip's ``_foreach_mul_``), ``torch._foreach_lerp_`` with a tensor weight: torch equivalents of the
old path, not the exact one (both the clip_grad_norm_ and the Adam row include the clip's multiply;
the lerp row leaves out the weight kernel). Training sizes (:data:`CASES`): the parameter shapes of
``eurusd_dqn``'s network (8 tensors), for one network and for 64 population members (no torch
library row there: torch has no per-member Adam), and ``cartpole_cleanrl``'s (6 tensors, 4 to 120
values per member in 5 of them) for 512 members, its hard target copy every 50 updates. State
evolves between calls.

Run: ``python -m bench.ops.bench_update_tail`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, print_table, provider_rows
from bench.ops.training import DEFAULT, training

#: (experiment, members): eurusd_dqn's network alone and 64 members (Polyak τ), cartpole_cleanrl's
#: 512 members (the hard copy every 50 updates, as in training: 1 call in 50 copies)
CASES = ((DEFAULT, 1), (DEFAULT, 64), ("cartpole_cleanrl", 512))


def rows(device: str = "cuda") -> list[dict]:
    import torch

    from foxdqn.ops.adam_step import adam_step_, adam_step_reference
    from foxdqn.ops.grad_norm import grad_norm_coefficient, grad_norm_coefficient_reference
    from foxdqn.ops.target_lerp import target_lerp_, target_lerp_reference

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    vec = dict(device=dev, dtype=torch.float32)
    out: list[dict] = []
    for experiment, members in CASES:
        t = training(experiment, device)
        lead = (members,) if members > 1 else ()
        shapes = [lead + tuple(s) for s in t.param_shapes]
        params = [0.05 * torch.randn(s, device=dev, generator=g) for s in shapes]
        grads = [1e-3 * torch.randn(s, device=dev, generator=g) for s in shapes]
        size = f"{experiment} P={members} {len(shapes)} tensors {sum(p.numel() for p in params)} values"
        mp = dict(members=members)

        max_norm = torch.full(lead, float(t.cfg.optim.grad_clip), **vec)

        def norm_ref(grads_, max_norm_, members):
            total, coef = torch.empty_like(max_norm_), torch.empty_like(max_norm_)
            grad_norm_coefficient_reference(grads_, max_norm_.view(-1), total.view(-1), coef.view(-1), members)
            return total, coef

        out += against_compile("bench_update_tail", "grad_norm_coefficient", size, grad_norm_coefficient,
                               norm_ref, grads, max_norm, **mp)
        _, coef = grad_norm_coefficient(grads, max_norm, **mp)

        m = [torch.zeros_like(p) for p in params]
        v = [torch.zeros_like(p) for p in params]
        steps = [torch.zeros(lead, **vec)] if members > 1 else [torch.zeros((), **vec) for _ in params]
        lr = torch.full(lead, float(t.cfg.optim.lr), **vec)
        skip = torch.zeros(lead, **vec)
        kw = dict(lr=lr, eps=float(t.cfg.optim.adam_eps), grad_scale=coef, skip=skip, **mp)
        out += against_compile("bench_update_tail", "adam_step_", size, adam_step_,
                               lambda *a, **k: adam_step_reference(*a, beta1=0.9, beta2=0.999, **k),
                               params, grads, m, v, steps, **kw)

        targets = [p.clone() for p in params]
        updates = torch.zeros((), device=dev, dtype=torch.int64)
        tau = torch.full(lead, 0.005, **vec)
        hard = t.cfg.target.update == "hard"  # the hard copy every `period` updates: w = 0 on the others
        period = torch.full(lead, int(t.cfg.target.period) if hard else 1000, device=dev, dtype=torch.int64)
        weight = torch.zeros(lead, **vec)
        lk = dict(hard=hard, advance=True, weight=weight, **mp)  # hard: 1 call in `period` copies, as in training
        out += against_compile("bench_update_tail", "target_lerp_", size, target_lerp_, target_lerp_reference,
                               targets, params, updates, skip, tau, period, **lk)

        if members == 1:  # what the single run used before these ops
            tparams = [torch.nn.Parameter(p.clone()) for p in params]
            for p, gr in zip(tparams, grads):
                p.grad = gr.clone()
            opt = torch.optim.Adam(tparams, lr=lr.clone(), eps=float(t.cfg.optim.adam_eps), fused=True,
                                   capturable=True)
            opt.found_inf = skip

            def torch_adam():
                torch._foreach_mul_([p.grad for p in tparams], coef)
                opt.step()

            w = torch.full((), 0.005, **vec)
            out += provider_rows("bench_update_tail", "grad_norm_coefficient", size, {
                "torch clip_grad_norm_": lambda: torch.nn.utils.clip_grad_norm_(tparams, float(t.cfg.optim.grad_clip),
                                                                                foreach=True)})
            out += provider_rows("bench_update_tail", "adam_step_", size, {"torch fused Adam + mul": torch_adam})
            out += provider_rows("bench_update_tail", "target_lerp_", size, {
                "torch _foreach_lerp_": lambda: torch._foreach_lerp_(targets, params, [w] * len(targets))})
    return out


if __name__ == "__main__":
    print_table(rows())
