"""Helpers shared by the test files: comparators, host-sync guards, CUDA graph capture, builders.

``tests/conftest.py`` puts this folder on ``sys.path``, so any test file imports them with
``from support import ...``. Nothing here runs at import time or needs CUDA until called.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from foxdqn.data import MarketData, market_data_from_frame
from foxdqn.data.features import rolling_volatility
from foxdqn.data.synthetic import make_synthetic_ohlcv
from foxdqn.nn.heads import DuelingHead, QHead
from foxdqn.nn.mlp import MLPEncoder
from foxdqn.nn.qnet import QNetwork
from foxdqn.step.iteration import WARMUP_ITERATIONS, Iteration, make_iteration
from foxdqn.config.compose import experiment_names, load_config

INF = float("inf")


# ---------------------------------------------------------------------------------------------
# comparators
# ---------------------------------------------------------------------------------------------
def assert_close_nan(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-5) -> None:
    """assert_close that reports NaN and Inf mismatches separately from value mismatches."""
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if not torch.equal(nan_a, nan_e):
        idx = (nan_a != nan_e).nonzero()[:5].tolist()
        raise AssertionError(f"NaN mismatch at {idx} (actual NaNs {int(nan_a.sum())}, expected {int(nan_e.sum())})")
    inf_a, inf_e = torch.isinf(a) & ~nan_a, torch.isinf(e) & ~nan_e
    if not (torch.equal(inf_a, inf_e) and torch.equal(a[inf_a], e[inf_e])):
        idx = ((inf_a != inf_e) | (inf_a & (a != e))).nonzero()[:5].tolist()
        raise AssertionError(f"Inf mismatch at {idx}")
    fin = ~(nan_a | inf_a)
    torch.testing.assert_close(a[fin], e[fin], atol=atol, rtol=rtol)


def assert_close_report(actual, expected, *, rtol=0.0, atol=0.0, name=""):
    """Compare with NaN and +/-Inf mismatches reported separately from value mismatches."""
    a = actual.detach().cpu().double().flatten()
    e = expected.detach().cpu().double().flatten()
    assert a.shape == e.shape, f"{name}: shape {a.shape} != {e.shape}"
    msgs = []
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if not torch.equal(nan_a, nan_e):
        msgs.append(f"NaN mismatch at {(nan_a != nan_e).nonzero().flatten().tolist()[:8]}")
    for sign, label in ((1, "+Inf"), (-1, "-Inf")):
        ia, ie = a == sign * INF, e == sign * INF
        if not torch.equal(ia, ie):
            msgs.append(f"{label} mismatch at {(ia != ie).nonzero().flatten().tolist()[:8]}")
    fin = torch.isfinite(a) & torch.isfinite(e)
    bad = fin & ((a - e).abs() > atol + rtol * e.abs())
    if bad.any():
        i = int(bad.nonzero()[0])
        msgs.append(f"{int(bad.sum())} values differ; first at {i}: {a[i].item()!r} vs {e[i].item()!r}")
    if msgs:
        raise AssertionError(f"{name}: " + "; ".join(msgs))


# ---------------------------------------------------------------------------------------------
# host syncs and CUDA graphs
# ---------------------------------------------------------------------------------------------
# Tensor methods that copy device data to the host (or read a value back to Python).
SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


class HostSync(AssertionError):
    """Raised by a Tensor method patched by :func:`forbid_syncs`."""


def forbid_syncs(monkeypatch) -> None:
    """Patch every :data:`SYNC_METHODS` method of ``torch.Tensor`` to raise :class:`HostSync`
    (an ``AssertionError`` whose message starts with ``host sync``)."""

    def make_raiser(name):
        def raiser(self, *args, **kwargs):
            raise HostSync(f"host sync: Tensor.{name} called")

        return raiser

    for name in SYNC_METHODS:
        monkeypatch.setattr(torch.Tensor, name, make_raiser(name))


@contextlib.contextmanager
def no_host_sync():
    """CUDA sync debug mode ``"error"`` inside the block (any synchronizing call raises)."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)


@contextlib.contextmanager
def side_stream():
    """Run the block on a fresh side stream (warm-up before capture); the current stream waits for it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        yield side
    torch.cuda.current_stream().wait_stream(side)


def cuda_kernels(fn, steps: int = 5, warmup: int = 3) -> tuple[float, list[str]]:
    """CUDA kernels (memsets and copies included; not the profiler's GPU ranges of user annotations
    such as ``Optimizer.step#Adam.step``) that ``fn()`` launches per call, from the torch profiler
    over ``steps`` calls after ``warmup`` calls; and their sorted distinct names."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type.name == "CUDA" and not e.is_user_annotation]
    return len(kernels) / steps, sorted(set(kernels))


def capture_graph(fn, warmup: int = 3, generators=()):
    """Call ``fn()`` ``warmup`` times on a side stream, then capture one call in a CUDA graph.

    Returns ``(graph, out)``: ``out`` is what the captured call returned (static tensors that
    ``graph.replay()`` rewrites). ``generators`` are registered with the graph before capture.
    ``warmup=0``: no warm-up (the caller ran it, e.g. on its own :func:`side_stream`).
    """
    if warmup:
        with side_stream():
            for _ in range(warmup):
                fn()
    graph = torch.cuda.CUDAGraph()
    for gen in generators:
        graph.register_generator_state(gen)
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def assert_replay_equals_eager(fn, change) -> None:
    """Capture ``fn`` (:func:`capture_graph`), then, without a host sync (:func:`no_host_sync`),
    change its inputs in place (``change()``), replay the graph and call ``fn`` eagerly: the
    replay's output must equal the eager one bit for bit."""
    graph, out = capture_graph(fn)
    with no_host_sync():
        change()
        graph.replay()
        eager = fn()
    assert torch.equal(out, eager)


def assert_replays_give(fn, eager, replays: int = 2) -> None:
    """Capture ``fn`` (:func:`capture_graph`; ``fn`` returns a list or tuple of tensors), fill its
    outputs with NaN, replay the graph ``replays`` times without a host sync (:func:`no_host_sync`):
    each output must then equal ``eager`` (the tensors of an eager call) bit for bit."""
    graph, out = capture_graph(fn)
    for x in out:
        x.fill_(float("nan"))
    with no_host_sync():
        for _ in range(replays):
            graph.replay()
    torch.cuda.synchronize()
    for x, y in zip(out, eager, strict=True):
        assert torch.equal(x, y)  # replay = eager, bit for bit


def capture_env_step(env, action, warmup_actions=None):
    """Warm up on a side stream (sync debug mode on), then capture one ``env.step(action)``.

    The warm-up steps ``action`` three times, or, given ``warmup_actions``, once per row copied
    into ``action`` first. The env's generator is registered with the graph.
    """
    with no_host_sync():
        with side_stream():
            if warmup_actions is None:
                for _ in range(3):
                    env.step(action)
            else:
                for a in warmup_actions:
                    action.copy_(a)
                    env.step(action)
        return capture_graph(lambda: env.step(action), warmup=0, generators=(env.generator,))


def assert_module_takes_op_without_gradient(monkeypatch, module, inputs, owner, name: str, **close) -> None:
    """``module(*inputs)`` calls ``owner.name`` (an op, counted through a spy) once inside
    :func:`foxdqn.ops.backend.cpu_kernels` without gradient, equal to its output outside (the
    torch path) to ``close``'s tolerances, and not at all in grad mode (parameters that need one)."""
    from foxdqn.ops import backend as B

    calls = []
    real = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad():
        want = module(*inputs)
        with B.cpu_kernels():
            got = module(*inputs)
    assert calls == [1]
    torch.testing.assert_close(got, want, **close)
    with B.cpu_kernels():
        module(*inputs)  # grad mode: the torch path
    assert calls == [1]


def skip_module_without(name: str) -> None:
    """At a test module's top: skip the module, as ``pytest.importorskip(name)`` does, where the
    package ``name`` is not installed, without importing it (optuna, mlflow, wandb: seconds each,
    in every pytest-xdist worker that collects the module while only one runs it)."""
    import importlib.util

    if importlib.util.find_spec(name) is None:
        pytest.skip(f"could not import {name!r}: No module named {name!r}", allow_module_level=True)


def require_compiled_kernels(interpret: bool):
    """An autouse fixture (assign it to a module-level name) failing ``gpu`` tests when the op's
    Triton kernels run in the interpreter (``interpret``: ``foxdqn.ops.backend.INTERPRET``)."""

    @pytest.fixture(autouse=True)
    def _gpu_tests_need_compiled_kernels(request):
        # tests/conftest.py defaults TRITON_INTERPRET=1; on the GPU machine the `gpu` tests must run
        # compiled kernels (graph capture and sync checks are meaningless in the interpreter).
        if "gpu" in request.keywords and interpret:
            pytest.fail("GPU tests need compiled Triton kernels: run them with TRITON_INTERPRET=0")

    return _gpu_tests_need_compiled_kernels


# ---------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------
def call_providers_once(monkeypatch) -> dict[str, list]:
    """bench.ops.common.bench_all replaced for a bench module's CPU test: each provider called once
    (``torch.compile`` not called: compiling would cost minutes on the CPU) and a fixed fake timing
    returned. Returns ``{provider: [its results, in call order]}``, filled as the rows are made."""
    from bench.ops import common

    results: dict[str, list] = {}

    def fake_bench_all(fns):
        for name, fn in fns.items():
            if name != "torch.compile":
                results.setdefault(name, []).append(fn())
        return {name: (1e-3, 1e-3, 1e-3, "fake") for name in fns}

    monkeypatch.setattr(common, "bench_all", fake_bench_all)
    return results


def market_from_arrays(open, high, low, close, spread, features, split=None, volatility=None,  # noqa: A002
                       median_spread=0.0, median_volatility=0.0, vol_window=2) -> MarketData:
    """:class:`MarketData` made straight from ``[T]`` arrays and ``[T, F]`` features, without foxdqn.data's
    checks (a test's bars need only be what the env reads), with one split ``"train"`` = ``split``
    (default ``(0, T)``). ``volatility`` defaults to the pipeline's rolling std of log returns over
    ``vol_window`` bars (at least 2 returns, else 0); hourly timestamps from 2020-01-01."""
    def f64(a):
        return np.asarray(a, dtype=np.float64)

    close = f64(close)
    T = close.shape[0]
    if volatility is None:
        volatility = np.nan_to_num(rolling_volatility(close, vol_window, min_periods=2), nan=0.0)
    features = np.asarray(features)
    return MarketData(
        source="arrays", timestamps=pd.date_range("2020-01-01", periods=T, freq="h"),
        open=f64(open), high=f64(high), low=f64(low), close=close, volume=None,
        features=features, feature_names=[f"f{i}" for i in range(features.shape[1])],
        spread=f64(spread), volatility=f64(volatility), median_spread=median_spread,
        median_volatility=median_volatility, splits={"train": tuple(split) if split is not None else (0, T)},
        bars_per_year=24 * 365.0)


def one_hot(states, n=2):
    return nn.functional.one_hot(torch.tensor(states), n).float()


def table_q(q) -> QNetwork:
    """Q network with Q(one-hot s, a) = q[s][a]."""
    t = torch.tensor(q, dtype=torch.float32)  # (S, A)
    net = QNetwork(MLPEncoder(t.shape[0], []), QHead(t.shape[0], t.shape[1]))
    with torch.no_grad():
        net.head.q.weight.copy_(t.T)
        net.head.q.bias.zero_()
    return net


def q_pair(d=6, a=3, seed=0, hidden=(16, 16)) -> tuple[QNetwork, QNetwork]:
    """A dueling MLP Q network (``torch.manual_seed(seed)``) and a target copy perturbed by 0.1 · N(0, 1)."""
    import copy

    torch.manual_seed(seed)
    online = QNetwork(MLPEncoder(d, list(hidden)), DuelingHead(hidden[-1], a))
    target = copy.deepcopy(online).requires_grad_(False)
    with torch.no_grad():
        for p in target.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return online, target


EXPERIMENTS = experiment_names()


def small_state(overrides=(), bars=1200, drift=1e-4, vol=2e-3, seed=0, device="cpu"):
    """``(state, market)``: the training state of a single run with debug=smoke caps (a population
    of one member, :func:`foxdqn.population.state.build_population`, as foxdqn.train trains it);
    synthetic bars for trading."""
    from foxdqn.population.state import build_population

    cfg = load_config(["debug=smoke", "debug.fit_prune_schedule=false", f"device={device}", "log.progress=false",
                       *overrides])  # tests set their pruning schedules in updates
    market = None
    if cfg.env.name == "trading":
        frame = make_synthetic_ohlcv(bars, drift_per_bar=drift, vol=vol, seed=seed)
        market = market_data_from_frame(frame, cfg.data, cfg.env.window, cfg.env.episode_length)
    return build_population([cfg], market, torch.device(device)), market


def step_fns(s=None) -> dict:
    """The population's step functions, as :class:`~foxdqn.step.iteration.Iteration` takes them:
    with state ``s`` foxdqn.population.train's (:func:`foxdqn.population.step.iteration_steps`: the
    collect steps beside the update where ``s``'s config has them so); without, the collect steps,
    then the update."""
    from foxdqn.population import step as P

    if s is not None:
        return P.iteration_steps(s)
    return dict(collect=P.collect_step, update=P.update_step, after_updates=P.publish_guard)


#: Experiments that need an optional package, and the package.
NEEDS = {"pong_dqn": "ale_py"}


def experiment_state(name, device="cpu", extra=()):
    """State for experiment ``name`` shrunk for tests (smoke caps; small replay; 2 updates/iter).
    Skips the test (with the reason) when the experiment needs an optional package that is absent."""
    import importlib.util

    if name in NEEDS and importlib.util.find_spec(NEEDS[name]) is None:
        pytest.skip(f"{name} needs the optional package {NEEDS[name]} (pip install 'foxdqn[atari]')")
    over = [f"+experiment={name}", "agent.updates_per_iter=2", "agent.steps_per_iter=2", "env.num_envs=8",
            "replay.capacity=4096", "agent.batch_size=32"]
    if name.startswith("bitflip"):
        over.append("env.n_bits=6")
    if name.startswith("pong"):  # 28224 uint8 values per observation
        over.append("replay.capacity=512")
    return small_state([*over, *extra], device=device)


def iterate(s, use_graph: bool, collect_iters: int, full_iters: int, **fns):
    """``collect_iters`` collect-only iterations, then ``full_iters`` full ones (captured with ``use_graph``;
    ``fns``: Iteration's step functions, default :func:`step_fns` of ``s``); on CUDA waits for
    the device. Returns the full iteration (its state is ``.s``, its graph ``.graph``)."""
    fns = fns or step_fns(s)
    collect_it, full_it = Iteration(s, use_graph, updates=0, **fns), Iteration(s, use_graph, **fns)
    for _ in range(collect_iters):
        collect_it()
    for _ in range(full_iters):
        full_it()
    if s.device.type == "cuda":
        torch.cuda.synchronize()
    return full_it


def captured_iteration(s):
    """Collect 4 iterations, then run the full iteration with the CUDA graph until it is captured
    (warm-up + 2 replays); returns the iteration (:func:`make_iteration`) (its ``graph`` is set)."""
    host = s.env.on_host
    collect = make_iteration(s, True, updates=0, on_host=host, **step_fns(s))
    full = make_iteration(s, True, on_host=host, **step_fns(s))
    for _ in range(4):
        collect()
    for _ in range(WARMUP_ITERATIONS + 2):
        full()
    assert full.graph is not None
    torch.cuda.synchronize()
    return full


def sync_free_part(iteration):
    """The part of a training iteration that must never synchronise: all of it for device envs,
    the (captured) update-only iteration for host envs (foxdqn.step.iteration.HostEnvIteration)."""
    return getattr(iteration, "update", iteration)


def train_eager(s, cfg) -> None:
    """Run ``cfg.agent.total_env_steps`` of eager training on state ``s``: collect-only iterations
    until ``learning_starts``, then full ones."""
    per_iter = cfg.env.num_envs * cfg.agent.steps_per_iter
    warm = math.ceil(cfg.agent.learning_starts / per_iter)
    collect, full = Iteration(s, False, updates=0, **step_fns(s)), Iteration(s, False, **step_fns(s))
    for it in range(math.ceil(cfg.agent.total_env_steps / per_iter)):
        (collect if it < warm else full)()


def member_network(s, p: int = 0):
    """``(network, action mode)``: member ``p``'s online weights of population ``s`` in a single
    run's network (:func:`foxdqn.step.build.build_network`), as ``python -m foxdqn.evaluate`` loads
    a checkpoint; the population's action mode."""
    from foxdqn.step.build import build_network

    net = build_network(s.cfgs[p], s.env, s.action_mode.num_actions).to(s.device)
    net.load_state_dict(s.online.member_state_dict(p))
    return net, s.action_mode


def train_run(cfg, market, run_dir, resume: dict | None = None) -> dict:
    """Train ``cfg`` as foxdqn.train trains a single run (a population of one, ``alone``:
    :func:`foxdqn.population.train.train_population`) into ``run_dir`` and return its summary;
    ``resume``: the run's checkpoint (a member's ``last.pt`` payload) to continue from.

    Raises:
        HaltError: the guard halted it (exit code 3; ``HALTED`` and its checkpoint were written).
        ConfigError: bad input (exit code 2; the outcome's message).
        StoppedBySignal: SIGINT/SIGTERM (exit code 128 + signal; its checkpoint was written).
    """
    from foxdqn.errors import ConfigError, HaltError
    from foxdqn.population.jobs import FINISHED, HALTED, Member
    from foxdqn.population.train import train_population

    member = Member(cfg, market, Path(run_dir), 0, [], resume, None if resume is None else resume["run_id"])
    [outcome] = train_population([member], alone=True)
    if outcome.exit_code == HALTED:
        raise HaltError(outcome.message)
    if outcome.exit_code != FINISHED:
        raise ConfigError(outcome.message)
    return outcome.summary


def interrupt_at(monkeypatch, iteration: int, signum: int) -> None:
    """Make the training loop (foxdqn.population.train) receive ``signum`` (a real signal, to its real
    handler) when it calls an iteration for the ``iteration``-th time."""
    import os

    import foxdqn.population.train as loop_mod

    real = loop_mod.make_iteration
    calls = {"n": 0}

    def make_iteration(*args, **kwargs):
        fn = real(*args, **kwargs)

        def wrapped():
            calls["n"] += 1
            if calls["n"] == iteration:
                os.kill(os.getpid(), signum)
            return fn()
        return wrapped
    monkeypatch.setattr(loop_mod, "make_iteration", make_iteration)


# ---------------------------------------------------------------------------------------------
# sweep folders (foxdqn.report.seeds, foxdqn.report.tables) built by hand: no training
# ---------------------------------------------------------------------------------------------
def fake_job(root: Path, name: str, overrides: list[str], val: float, *, returns=None, bh_returns=None,
             metric: str = "sharpe", mean_return: float | None = None, val_curve=None, trades: float = 10.0,
             excluded: str | None = None, stop: dict | None = None) -> Path:
    """A finished job folder ``root/name`` as a multirun leaves it: ``.hydra/overrides.yaml``,
    ``eval/summary.json`` selected on val ``metric`` = ``val``, and for a trading job (``returns``
    ``[S]`` per-bar returns, ``bh_returns`` buy-and-hold's) ``eval/equity.csv``; an episodic job
    (``mean_return``) has no ``split``. ``val_curve``: {env step: val value} rows of metrics.csv,
    between train rows. ``trades``: the agent's test trades; ``excluded`` and ``stop``: the
    selection's ``excluded`` and the summary's ``stop`` (foxdqn.run.search)."""
    job = root / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (job / "eval").mkdir()
    selection = {"split": "val", "metric": metric, "value": val, "weights": "last", "excluded": excluded}
    if mean_return is not None:
        summary = {"selection": selection, "env_steps": 1024, "metrics": {"agent": {
            "episodes": 10, "mean_return": mean_return, "std_return": 1.0}}}
    else:
        equity = np.concatenate([[1.0], np.cumprod(1 + returns)])
        bh = np.concatenate([[1.0], np.cumprod(1 + bh_returns)])
        pd.DataFrame({"timestamp": range(equity.size), "agent_equity": equity, "buy_and_hold_equity": bh,
                      "flat_equity": 1.0}).to_csv(job / "eval" / "equity.csv", index=False)
        sharpe = float(np.mean(returns) / np.std(returns, ddof=1) * np.sqrt(252))
        summary = {"split": "test", "bars_per_year": 252.0, "selection": selection, "env_steps": 1024,
                   "metrics": {"agent": {"total_return": equity[-1] - 1, "sharpe": sharpe, "max_drawdown": 0.1,
                                         "num_trades": trades},
                               "buy_and_hold": {"total_return": bh[-1] - 1, "sharpe": 1.0}}}
    if stop is not None:
        summary["stop"] = stop
    (job / "eval" / "summary.json").write_text(json.dumps(summary))
    if val_curve is not None:
        rows = []
        for step, v in val_curve.items():
            rows += [{"step": step, "train/loss": 0.1}, {"step": step, f"val/{metric}": v}]
        pd.DataFrame(rows).to_csv(job / "metrics.csv", index=False)
    return job


#: tensor lists of the multi-tensor op tests (foxdqn/ops/tensor_list.py): one element, a prime size,
#: sizes across blocks, ten tensors (more than one launch holds) with an empty one
MULTI_TENSOR_SHAPES = {
    "one_element": [(1,)],
    "seven": [(7,)],
    "two_big": [(1000,), (4097,)],
    "ten_with_empty": [(3, 5), (0,), (1,), (4097,), (7, 2), (11,), (1000,), (2, 2, 2), (9,), (13,)],
}


def randn_list(shapes, seed, members=1, device="cpu", scale=1.0) -> list:
    """Standard normal tensors of ``shapes`` (each with a leading ``[members]`` axis when members > 1)
    times ``scale``, drawn on the CPU from ``seed``, moved to ``device``."""
    g = torch.Generator().manual_seed(seed)
    lead = (members,) if members > 1 else ()
    return [(torch.randn(lead + tuple(s), generator=g) * scale).to(device) for s in shapes]


def assert_within_ulps(actual, expected, ulps, name=""):
    """|a - e| <= ``ulps`` float32 ulps (2**-23) of the tensor's largest |e| (a cancelling element
    keeps an absolute error of the size of its terms); the report names ``name``."""
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    assert_close_report(actual, expected, atol=ulps * 2.0**-23 * scale + 1e-30, name=name)


def assert_close_ulps(actual, expected, rtol, ulps, name=""):
    """|a - e| <= rtol |e| + ``ulps`` float32 ulps (2**-23) of max |e|, in float64
    (``torch.testing.assert_close``; a NaN on either side fails): sums that cancel keep an absolute
    error of the size of their terms. The fused MLP kernels' comparator (tests/ops/test_mlp_chain.py,
    test_q_forward.py)."""
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    torch.testing.assert_close(actual.detach().cpu().double(), expected.detach().cpu().double(), rtol=rtol,
                               atol=ulps * 2.0**-23 * scale + 1e-30, msg=name)


def round_tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 → TF32 (10 mantissa bits), to nearest with ties away from zero, NaN kept (numpy): what
    the fused MLP kernels do to a product's operands where torch's matmuls run in TF32."""
    a = t.detach().cpu().numpy().astype(np.float32)
    r = ((a.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    return torch.from_numpy(np.where(np.isnan(a), a, r))


def torch_clip(grads, max_norm):
    """torch.nn.utils.clip_grad_norm_ (foreach) on copies of ``grads``: ``(total, clipped grads)``."""
    params = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros_like(g))
        p.grad = g.clone()
        params.append(p)
    total = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    return total, [p.grad for p in params]


def clone_all(tensors) -> list:
    """Detached copies of ``tensors``."""
    return [t.detach().clone() for t in tensors]


def all_equal(xs, ys) -> bool:
    """Two tensor lists of the same length, equal element for element (bit for bit)."""
    return len(xs) == len(ys) and all(torch.equal(x, y) for x, y in zip(xs, ys))


# ---------------------------------------------------------------------------------------------
# W&B offline runs (foxdqn.logger.wandb_log), read back without a network
# ---------------------------------------------------------------------------------------------
def wandb_records(path: Path) -> list:
    """The records (``wandb.proto.wandb_internal_pb2.Record``) of an offline run's ``run-<id>.wandb``
    file: W&B's LevelDB-style log (a 7-byte header ``:W&B``, 0xBEE1, version; then 32 KiB blocks of
    records, each a 7-byte header: checksum, little-endian length, type FULL 1 / FIRST 2 / MIDDLE 3 /
    LAST 4; a block's tail shorter than a header is padding)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", path
    pos, block, out, chunk = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7 or data[pos + 6] == 0:  # padding to the block's end
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if pos + 7 + length > len(data):  # a record still being written: the records before it
            break
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(chunk)
            out.append(record)
            chunk = b""
    return out


def wandb_offline_runs(run_dir: Path, timeout: float = 30.0) -> tuple[list, list]:
    """The offline runs' files (``run_dir/wandb/offline-run-*/run-*.wandb``, sorted) and their
    records (:func:`wandb_records`). W&B's service process writes the file; on a loaded
    machine its last records were seen to land after wandb.finish() returned (make test on a fresh
    clone, 1 of 3 runs), and a record read while it was written did not parse (1 of 4): read again
    until every file parses and has its run and exit records (``exit``: written by finish), for up
    to ``timeout`` s."""
    import time

    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + timeout
    while True:
        files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
        assert files, list((run_dir / "wandb").iterdir())
        try:
            records = [wandb_records(f) for f in files]
        except DecodeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
            continue
        whole = all({"run", "exit"} <= {r.WhichOneof("record_type") for r in rs} for rs in records)
        if whole or time.monotonic() > deadline:
            return files, records
        time.sleep(0.5)


def wandb_history(records) -> list[dict]:
    """The history rows (``run.log`` calls) of :func:`wandb_records`: {key: value} with ``_step``."""
    rows = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            rows.append({"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in r.history.item})
    return rows


# ---------------------------------------------------------------------------------------------
# command lines
# ---------------------------------------------------------------------------------------------

class CliServer:
    """``python -m MODULE ARGS`` calls for one interpreter start and one import of MODULE (torch,
    Hydra: about 2.5 s a call on 2 CPU cores), or ``python SCRIPT.py ARGS`` calls for a MODULE that
    is the path of a script: :meth:`run` gives what ``subprocess.run([sys.executable,
    "-m", MODULE, *args], cwd=cwd, env=env, capture_output=True, text=True)`` gives, from a child that
    ``tests/cli_server.py`` forks once the imports are done and that runs MODULE as ``__main__`` in
    full. For calls whose outcome does not depend on being the first thing the interpreter ran:
    the exit status and output of bad input, refusals, short runs (a run's timings.json counts the
    server's wait in ``imports``). :meth:`start` gives the child while it runs (:class:`CliProcess`:
    its pid, for a signal). The server starts at the first call; one call at a time; :meth:`close`
    ends it."""

    def __init__(self, module: str, env: dict, folder: Path) -> None:
        self.module, self.env, self.folder, self.calls, self.proc = module, env, Path(folder), 0, None
        self._buffer = b""

    def run(self, args, cwd, env: dict | None = None, timeout: float = 300,
            environ: dict | None = None) -> subprocess.CompletedProcess:
        """``environ``: variables set in the child before MODULE runs, for ones the command reads as it
        runs (never at import: those need ``env``, a process of their own)."""
        return self.start(args, cwd, env, environ, timeout=timeout).wait(timeout)

    def start(self, args, cwd, env: dict | None = None, environ: dict | None = None,
              timeout: float = 300) -> CliProcess:
        """The call of :meth:`run` started: its child, once forked (within ``timeout`` s)."""
        assert env is None or env == self.env, "another environment needs a process of its own"
        if self.proc is None:  # at the first call
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("cli_server.py")), self.module],
                                         env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         start_new_session=True)
            self._buffer = b""
        self.calls += 1
        out, err = self.folder / f"{self.calls}.out", self.folder / f"{self.calls}.err"
        for path in (out, err):  # empty for a child killed before it opens them
            path.write_text("")
        request = {"args": [str(a) for a in args], "cwd": str(cwd), "stdout": str(out), "stderr": str(err),
                   "env": {str(k): str(v) for k, v in (environ or {}).items()}}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        pid = self._reply(timeout, args)
        if pid is None:
            self.close(kill=True)
            raise subprocess.TimeoutExpired(list(args), timeout)
        return CliProcess(self, list(args), pid["pid"], out, err)

    def _reply(self, timeout: float | None, args):
        """The server's next reply line (JSON); None where none came within ``timeout`` s (0: none
        waiting now; None: waits)."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            if timeout is not None and not select.select([fd], [], [], timeout)[0]:
                return None
            chunk = os.read(fd, 4096)
            assert chunk, f"tests/cli_server.py {self.module} ended (exit status {self.proc.wait()})"
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self, kill: bool = False) -> None:
        """End the server: at the end of its input, or (``kill``) at once with the call it runs."""
        if self.proc is None:
            return
        if self.proc.poll() is None and not kill:
            self.proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None  # a later call starts another


class CliProcess:
    """A call of :meth:`CliServer.start` while its child runs: ``pid`` (a process of its own, for
    ``os.kill``), :meth:`poll` and :meth:`wait` as subprocess.Popen's (the exit status; ``-N``:
    killed by signal N); the child's stdout and stderr go to files, read by :meth:`wait`."""

    def __init__(self, server: CliServer, args: list, pid: int, out: Path, err: Path) -> None:
        self.server, self.args, self.pid, self.out, self.err = server, args, pid, out, err
        self.returncode: int | None = None

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def poll(self) -> int | None:
        if self.returncode is None:
            status = self.server._reply(0, self.args)
            self.returncode = None if status is None else status["status"]
        return self.returncode

    def wait(self, timeout: float = 300) -> subprocess.CompletedProcess:
        """The CompletedProcess of the call (its output read back), once the child ended (within
        ``timeout`` s, else the server and its child are killed and subprocess.TimeoutExpired raised)."""
        if self.returncode is None:
            status = self.server._reply(timeout, self.args)
            if status is None:
                self.server.close(kill=True)
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = status["status"]
        return subprocess.CompletedProcess(self.args, self.returncode, self.out.read_text(), self.err.read_text())


def fresh_python(code: str, timeout: float = 300) -> list[str]:
    """The words ``code`` prints in a fresh interpreter (this one's, nothing imported): what a
    start-up imports. Fails the test with its stderr when it exits non-zero."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()
