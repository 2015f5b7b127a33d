"""Kernel launches of one step counted on the CPU: what a collect step or an update would launch
on CUDA, listed without a GPU (issue 33: a population's steps, of one member or of several).

Inside :func:`foxdqn.ops.backend.cpu_kernels` every op of ``foxdqn.ops`` runs its Triton kernel
(Triton's interpreter, ``TRITON_INTERPRET=1``) and the networks take their fused forwards, as on
CUDA. :func:`launches` profiles one eager call of a step (``torch.profiler``, CPU activity), each
Triton launch inside a profiler range ``triton::<kernel>``, and walks the events from the top:

* a ``triton::`` range is one launch (its interpreter's copies are not looked into);
* an ``aten::`` op is one launch (a composite op, e.g. ``aten::linear``, counts once), except the
  ops that launch nothing on CUDA (views, reshapes, ``empty``: :data:`FREE`), and ``to`` /
  ``contiguous`` / ``reshape`` / ``flatten`` that return their input (counted where they copy);
* any other event (an autograd Function's range, the autograd engine's
  ``evaluate_function: ...``) is looked into: its ops are counted.

Host reads of device values (``aten::item``, ``aten::_local_scalar_dense``: a sync on CUDA) are
listed too. The count is close to, not equal to, the CUDA profiler's (bench/kernels_bench.py):
cuBLAS may split a GEMM or add an epilogue kernel, a composite aten op may launch several kernels,
and memsets are not kernels there.

``python -m bench.cpu_kernels [EXPERIMENT ...]`` (default ``eurusd_dqn cartpole_cleanrl``) lists
the launches of a population's collect step and update (3 members; with ``--single`` also of
a population of one, a single run), small (``--shipped-widths``: the experiments' own network
widths, whose layers take the ops the GPU runs at those widths).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

if __name__ == "__main__":  # the command: before foxdqn.ops is imported (Triton reads it at @jit). Not on
    # import: a process that imports this module (a GPU test session collecting its tests) must keep
    # its compiled kernels (tests/conftest.py sets it for the CPU suite)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

#: aten ops that launch no kernel on CUDA (views, metadata, allocations).
FREE = frozenset(f"aten::{n}" for n in (
    "view", "_unsafe_view", "_reshape_alias", "view_as", "reshape", "flatten", "expand", "expand_as", "detach",
    "alias", "select", "slice", "narrow", "t", "transpose", "permute", "unsqueeze", "squeeze", "unsqueeze_",
    "squeeze_", "movedim", "unbind", "split", "split_with_sizes", "chunk", "as_strided", "broadcast_tensors",
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "result_type",
    "resolve_conj", "resolve_neg", "to", "contiguous", "set_", "numpy_T", "is_nonzero", "_has_compatible_shallow_copy_type"))
#: ops of :data:`FREE` that launch a copy when they do not return their input.
MAY_COPY = frozenset(f"aten::{n}" for n in ("to", "contiguous", "reshape", "flatten"))
COPIES = frozenset(f"aten::{n}" for n in ("copy_", "_to_copy", "clone", "_copy_from"))
#: host reads of device values (a sync on CUDA).
HOST_READS = frozenset(("aten::item", "aten::_local_scalar_dense"))

SMALL = {
    "cartpole": ("debug=smoke", "env.num_envs=4", "replay.capacity=512", "agent.batch_size=16",
                 "model.hidden=[16,8]"),
    "trading": ("debug=smoke", "env.num_envs=3", "replay.capacity=300", "agent.batch_size=8", "model.hidden=[16]",
                "env.window=8", "env.episode_length=16"),
    "bitflip": ("debug=smoke", "env.num_envs=4", "env.n_bits=6", "replay.capacity=512", "agent.batch_size=16",
                "model.hidden=[16]"),
}


@contextlib.contextmanager
def _named_triton_launches():
    """Each interpreted Triton launch inside a profiler range ``triton::<kernel name>``."""
    from torch.profiler import record_function
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run

    def named(self, *args, **kwargs):
        with record_function(f"triton::{self.__name__}"):
            return run(self, *args, **kwargs)

    InterpretedFunction.run = named
    try:
        yield
    finally:
        InterpretedFunction.run = run


def _copies(event) -> bool:
    return any(c.name in COPIES or _copies(c) for c in event.cpu_children)


def _walk(event, out: list[str]) -> None:
    name = event.name
    if name.startswith("triton::") or name in HOST_READS:
        out.append(name)
    elif name.startswith("aten::"):
        if name not in FREE or (name in MAY_COPY and _copies(event)):
            out.append(name)
    else:
        for child in event.cpu_children:
            _walk(child, out)


def launches(fn, warmup: int = 1) -> list[str]:
    """The launches (names, in order) of one call of ``fn()`` on CPU tensors inside
    :func:`foxdqn.ops.backend.cpu_kernels` (module docstring), after ``warmup`` calls there.

    Raises:
        RuntimeError: TRITON_INTERPRET=1 was not set before foxdqn.ops was imported.
    """
    from torch.profiler import ProfilerActivity, profile

    from foxdqn.ops.backend import cpu_kernels

    with cpu_kernels(), _named_triton_launches():
        for _ in range(warmup):
            fn()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
    out: list[str] = []
    for event in prof.events():
        if event.cpu_parent is None:
            _walk(event, out)
    return out


#: with :func:`small_overrides`' ``shipped_widths``: the experiment's own network widths (smoke's
#: ``debug.max_hidden`` cap lifted), so the layers take the ops they take on the GPU at those widths
#: (the MLP chain up to 128 units, the member linear kernel and cuBLAS above)
SHIPPED_WIDTHS = ("debug.max_hidden=null",)


def small_overrides(experiment: str, shipped_widths: bool = False) -> tuple[str, ...]:
    """:data:`SMALL` overrides of ``experiment``'s env (its config composed once); with
    ``shipped_widths`` without ``model.hidden`` and with :data:`SHIPPED_WIDTHS` (the experiment's
    own network, small batches and envs)."""
    from foxdqn.config.compose import load_config

    over = SMALL[str(load_config([f"+experiment={experiment}"]).env.name)]
    if not shipped_widths:
        return over
    return tuple(o for o in over if not o.startswith("model.hidden=")) + SHIPPED_WIDTHS


def step_launches(experiment: str, members: int, overrides: tuple[str, ...] = (),
                  shipped_widths: bool = False) -> dict[str, list[str]]:
    """``{"collect": [...], "update": [...]}``: the launches of one collect step and one update of
    ``experiment`` (with :func:`small_overrides` and ``overrides``) on the CPU, a population's of
    ``members`` (seeds 0 .. members − 1; 1: a single run)."""
    from bench.harness import make_population
    from foxdqn.population.step import collect_step, update_step

    over = [f"+experiment={experiment}", *small_overrides(experiment, shipped_widths), *overrides]
    s = make_population(over, members, "cpu")
    return {"collect": launches(lambda: collect_step(s)), "update": launches(lambda: update_step(s))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cpu_kernels", description=__doc__.splitlines()[0])
    ap.add_argument("experiments", nargs="*", default=["eurusd_dqn", "cartpole_cleanrl"])
    ap.add_argument("--members", type=int, default=3, help="population members (default 3)")
    ap.add_argument("--single", action="store_true", help="also list a single run's steps (a population of one)")
    ap.add_argument("--shipped-widths", action="store_true",
                    help="the experiments' own network widths (slower; the layers' ops as on the GPU at those widths)")
    args = ap.parse_args(argv)
    for name in args.experiments:
        runs = ([("single run", 1)] if args.single else []) + [(f"population of {args.members}", args.members)]
        for label, members in runs:
            for phase, ops in step_launches(name, members, shipped_widths=args.shipped_widths).items():
                print(f"== {name}, {label}, {phase}: {len(ops)} launches")
                for op in ops:
                    print(f"    {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
