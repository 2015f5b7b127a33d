"""Benchmark: q_forward_epsilon_greedy (a Q network's ε-greedy actions from its weights, one kernel).

At ``eurusd_dqn``'s sizes (MLP 162 → 256 → 256 with the dueling head of 45 actions, the network's
own parameters, built by ``foxdqn/step/build.py``): the collect step of the 4,096 envs
(``bench/ops/training.py``'s ``TRADING_ENVS``) and a population of 8 members of 512 envs each
(:class:`foxdqn.population.network.MemberQNetwork`'s ``[P, in, out]`` weights). ε = 0.5 at the
step counter (half the rows explore). Providers: ``triton`` (the op), ``torch`` (the reference:
the torch Q network then the torch ε-greedy, eager), ``torch.compile`` of the reference, and
``two ops``: :func:`foxdqn.ops.q_forward.q_forward` then
:func:`foxdqn.ops.epsilon_greedy.epsilon_greedy` (two kernels: the collect step's path before
this op). Matmul precision as in training (TF32 by default).

Run: ``python -m bench.ops.bench_q_forward_epsilon_greedy`` (needs CUDA). Nothing runs at import.
"""
from __future__ import annotations

from bench.ops.common import against_compile, print_table, provider_rows
from bench.ops.training import DEFAULT, at_training_precision

BENCH = "bench_q_forward_epsilon_greedy"
MEMBERS = 8  # members of the population row (their rows split the collect step's envs)


def rows(device: str = "cuda") -> list[dict]:
    """The rows, timed under the experiment's matmul precision (restored after)."""
    return at_training_precision(DEFAULT, device, _rows)


def _rows(t, dev) -> list[dict]:
    import copy

    import torch

    from foxdqn.ops.epsilon_greedy import epsilon_greedy
    from foxdqn.ops.q_forward import q_forward
    from foxdqn.ops.q_forward_epsilon_greedy import q_forward_epsilon_greedy, q_forward_epsilon_greedy_reference
    from foxdqn.population.network import MemberQNetwork

    g = torch.Generator(device=dev).manual_seed(0)
    net = copy.deepcopy(t.net).requires_grad_(False)
    linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    cases = [(1, t.num_envs, [m.weight for m in linears], [m.bias for m in linears])]
    members = MemberQNetwork.from_networks([net] * MEMBERS, "relu").to(dev).requires_grad_(False)
    cases.append((MEMBERS, t.num_envs // MEMBERS, list(members.weights), list(members.biases)))
    dims = "->".join(str(d) for d in [t.obs_dim, *(m.weight.shape[0] for m in linears[:-2])])
    out: list[dict] = []
    for p, m, ws, bs in cases:
        x = torch.randn(*((p,) if p > 1 else ()), m, t.obs_dim, device=dev, generator=g)
        sched = dict(step=torch.tensor(50, device=dev), start=torch.ones(p, device=dev),
                     end=torch.zeros(p, device=dev), duration=torch.full((p,), 100.0, device=dev),
                     u=torch.rand(p, 2, m, device=dev, generator=g))
        size = f"{'P=%d ' % p if p > 1 else ''}M={m} {dims}->dueling {t.num_actions}"
        out += against_compile(BENCH, "q_forward_epsilon_greedy", size, q_forward_epsilon_greedy,
                               q_forward_epsilon_greedy_reference, x, ws, bs, dueling=True, **sched)

        def two_ops(x=x, ws=ws, bs=bs, sched=sched):
            q = q_forward(x, ws, bs, dueling=True)
            return epsilon_greedy(q.reshape(-1, q.shape[-1]), sched["step"], sched["start"], sched["end"],
                                  sched["duration"], sched["u"])
        out += provider_rows(BENCH, "q_forward_epsilon_greedy", size, {"two ops": two_ops})
    return out


if __name__ == "__main__":
    print_table(rows())
