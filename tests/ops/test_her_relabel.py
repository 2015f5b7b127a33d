"""foxdqn.ops.her_relabel: the Triton kernel (TRITON_INTERPRET=1 on CPU) against the torch
reference, bit for bit, on rings of bit-flipping episodes (episodes that wrap around the ring, rows
next to the write position, episodes that end inside the window, a partly filled ring), window 1,
members with their own γ and reward scale (floats, [P] and [R] tensors), uniforms at 0 and just
below 1 and a relabel test at p_relabel itself, stacked and flat batches, odd batch sizes; the
relabeler's choice of backend and bad arguments. GPU (`gpu` marker): kernel = reference on CUDA,
CUDA-graph capture."""
from __future__ import annotations

import pytest
import torch

from foxdqn.envs.bitflip import BitFlipEnv
from foxdqn.ops import backend as B
from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.her_relabel import her_relabel, her_relabel_reference
from foxdqn.ops.replay_gather import stacked_pair
from foxdqn.replay.buffer import Batch, ReplayBuffer
from foxdqn.replay.her import HindsightRelabeler

from support import capture_graph, no_host_sync, require_compiled_kernels

_need_compiled = require_compiled_kernels(INTERPRET)

FIELDS = ("obs", "next_obs", "reward", "discount", "pair")
JUST_BELOW_ONE = 1.0 - 2.0 ** -24  # the largest float32 below 1


def _ring(rows, envs, n_bits, written, seed=0, device="cpu"):
    """(ReplayBuffer of ``rows`` time rows × ``envs`` envs after ``written`` random bit-flipping
    steps, the env): episodes end on success or after n steps, wrap around the ring once
    ``written`` > ``rows``."""
    g = torch.Generator(device=device).manual_seed(seed)
    env = BitFlipEnv(envs, n_bits, device, g)
    buf = ReplayBuffer(rows * envs, envs, 2 * n_bits, torch.device(device), n_step=1)
    obs = env.reset_all()
    for _ in range(written):
        action = torch.randint(0, n_bits, (envs,), generator=g, device=device)
        out = env.step(action)
        buf.add(obs, action, out.reward, out.next_obs, out.terminated, out.truncated)
        obs = out.obs
    return buf, env


def _batch(buf, members, b, seed, stacked):
    """(index [R], obs, next_obs): member p's B rows from its own env columns (member-major), with
    rows at the newest time row (age 0) and the one before it among them; obs and next_obs
    ``[R, D]``, or the ``[P, B, D]`` halves of a stacked pair."""
    g = torch.Generator().manual_seed(seed)
    per = buf.num_envs // members
    t = torch.randint(0, int(buf.filled()), (members, b), generator=g)
    t = (int(buf.ptr) - int(buf.filled()) + t) % buf.rows  # written rows only
    t[:, 0] = (int(buf.ptr) - 1) % buf.rows
    t[:, -1] = (int(buf.ptr) - 2) % buf.rows
    e = torch.randint(0, per, (members, b), generator=g) + per * torch.arange(members)[:, None]
    index = (t * buf.num_envs + e).reshape(-1)
    ti, ei = index // buf.num_envs, index % buf.num_envs
    obs, next_obs = buf.obs[ti, ei], buf.next_obs[ti, ei]
    if stacked:
        pair = torch.stack([obs.view(members, b, -1), next_obs.view(members, b, -1)], dim=1)
        obs, next_obs = (pair[0, 0], pair[0, 1]) if members == 1 else (pair[:, 0], pair[:, 1])
        assert stacked_pair(obs, next_obs) is pair
    return index, obs, next_obs


def _uniforms(members, b, seed, p_relabel):
    """float32 [P, 2, B]: random, with 0, just below 1 and p_relabel (rounded to float32) among them."""
    u = torch.rand(members, 2, b, generator=torch.Generator().manual_seed(seed))
    u[:, 0, :2] = torch.tensor([0.0, JUST_BELOW_ONE])[:b]
    u[:, 1, :3] = torch.tensor([0.0, JUST_BELOW_ONE, p_relabel])[:b]
    return u


def _args(buf, env, index, obs, next_obs, u, gamma, scale, window, p_relabel):
    return (env, buf.episode, buf.ptr, buf.next_obs, index, obs, next_obs, u, gamma, scale, window, p_relabel)


def _assert_same(a, b):
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), name


def _coefficients(kind, members, rows):
    """(γ, reward scale): floats, one per member [P], or one per row [R]."""
    if kind == "float":
        return 0.97, 2.5
    if kind == "members":
        return 0.99 - 0.01 * torch.arange(members, dtype=torch.float32), 1.0 + torch.arange(members).float()
    g = torch.Generator().manual_seed(rows)
    return torch.rand(rows, generator=g), torch.randn(rows, generator=g)


CASES = [  # rows, envs, bits, written, members, batch per member, window (None: n bits), k
    pytest.param(9, 3, 5, 6, 1, 37, None, 4, id="partial"),
    pytest.param(9, 3, 5, 31, 1, 33, None, 5, id="wrapped"),
    pytest.param(7, 4, 6, 40, 2, 19, None, 1, id="wrapped-members"),
    pytest.param(11, 6, 4, 50, 3, 5, 1, 4, id="window-1-members"),
    pytest.param(5, 2, 9, 23, 2, 3, None, 2, id="window-beyond-ring"),
    pytest.param(8, 1, 3, 3, 1, 2, None, 4, id="one-env-two-rows"),
]


@pytest.mark.parametrize("rows,envs,bits,written,members,b,window,k", CASES)
@pytest.mark.parametrize("coefficients", ["float", "members", "rows"])
@pytest.mark.parametrize("stacked", [False, True])
def test_kernel_equals_reference(rows, envs, bits, written, members, b, window, k, coefficients, stacked):
    buf, env = _ring(rows, envs, bits, written, seed=rows + written)
    index, obs, next_obs = _batch(buf, members, b, seed=b, stacked=stacked)
    gamma, scale = _coefficients(coefficients, members, members * b)
    p_relabel = k / (k + 1.0)
    u = _uniforms(members, b, seed=k, p_relabel=p_relabel)
    flat_u = u.transpose(0, 1).reshape(2, members * b)  # the same draws as [2, R]
    for uu in (u, flat_u):
        args = _args(buf, env, index, obs, next_obs, uu, gamma, scale, window or bits, p_relabel)
        ref = her_relabel_reference(*args, stacked=stacked)
        ker = her_relabel(*args, stacked=stacked, backend="triton")
        _assert_same(ker, ref)
    # each member's row 0 (u = 0, 0) takes its own next state as the goal: reached, no bootstrap;
    # its row 1 (u₁ just below 1 > p_relabel) keeps its goal
    assert torch.equal(ref.reward.view(members, b)[:, 0], torch.zeros(members))
    assert torch.equal(ref.discount.view(members, b)[:, 0], torch.zeros(members))
    goals = ref.obs.reshape(members, b, -1)[:, 1, bits:]
    assert torch.equal(goals, obs.reshape(members, b, -1)[:, 1, bits:])


def test_relabel_at_p_relabel_is_float32s_comparison():
    """u₁ equal to float32(5/6) (below 5/6) is not relabelled with k = 5: the comparison is float32's,
    as torch compares a float32 tensor with a Python float."""
    buf, env = _ring(9, 3, 5, 31, seed=3)
    index, obs, next_obs = _batch(buf, 1, 40, seed=1, stacked=False)
    p_relabel = 5 / 6.0
    u = torch.zeros(2, 40)
    u[1] = p_relabel
    assert float(u[1, 0]) < p_relabel  # a double comparison would relabel
    for backend in ("torch", "triton"):
        out = her_relabel(*_args(buf, env, index, obs, next_obs, u, 0.9, 1.0, 5, p_relabel), backend=backend)
        assert torch.equal(out.obs, obs) and torch.equal(out.next_obs[:, 5:], obs[:, 5:]), backend


def test_goals_come_from_the_rows_own_episode():
    """Every relabelled goal is the achieved goal (next state) of a row of the same env and episode,
    at most window − 1 rows later and not after the newest row; reward 0 and discount 0 exactly
    where the next state reaches the goal."""
    buf, env = _ring(7, 4, 6, 40, seed=5)
    index, obs, next_obs = _batch(buf, 2, 64, seed=2, stacked=False)
    u = torch.rand(2, 128, generator=torch.Generator().manual_seed(0))
    out = her_relabel(*_args(buf, env, index, obs, next_obs, u, 0.9, 2.0, 6, 1.0), backend="triton")
    newest = int(buf.ptr) - 1
    for r, i in enumerate(index.tolist()):
        t, e = divmod(i, buf.num_envs)
        allowed = []
        for j in range(6):
            tj = (t + j) % buf.rows
            if j <= (newest - t) % buf.rows and buf.episode[tj, e] == buf.episode[t, e]:
                allowed.append(buf.next_obs[tj, e, :6])
        assert any(torch.equal(out.obs[r, 6:], a) for a in allowed), r
        hit = torch.equal(next_obs[r, :6], out.obs[r, 6:])
        assert float(out.reward[r]) == (0.0 if hit else -2.0)
        assert float(out.discount[r]) == (0.0 if hit else float(torch.tensor(0.9)))


def test_relabeler_runs_the_kernel_for_bit_goal_envs_only():
    """HindsightRelabeler.relabel_with takes the kernel inside cpu_kernels for a bit-flipping env
    (one launch, the reference's result) and the env's goal methods for an env without the bit-goal
    layout (a float64 bit-flipping env), whose Triton backend refuses it."""
    from bench.cpu_kernels import launches

    buf, env = _ring(9, 3, 5, 31, seed=1)
    index, obs, next_obs = _batch(buf, 1, 16, seed=0, stacked=True)
    batch = Batch(obs, torch.zeros(16, dtype=torch.int64), torch.zeros(16), next_obs, torch.ones(16), torch.ones(16),
                  index)
    u = torch.rand(2, 16, generator=torch.Generator().manual_seed(0))
    relabel = HindsightRelabeler(env, 4, 0.9, 2.0)
    want = relabel.relabel_with(buf, batch, u, 0.9, 2.0)
    assert relabel.fused and stacked_pair(want.obs, want.next_obs) is not None
    with B.cpu_kernels():
        ops = launches(lambda: relabel.relabel_with(buf, batch, u, 0.9, 2.0))
        got = relabel.relabel_with(buf, batch, u, 0.9, 2.0)
    assert ops == ["triton::_her_relabel_kernel"], ops
    for f in ("obs", "next_obs", "reward", "discount"):
        assert torch.equal(getattr(got, f), getattr(want, f)), f

    wide = BitFlipEnv(3, 5, "cpu", torch.Generator(), dtype=torch.float64)
    assert not wide.her_bit_goals and not HindsightRelabeler(wide, 4, 0.9).fused
    with B.cpu_kernels():
        assert "triton::_her_relabel_kernel" not in launches(
            lambda: HindsightRelabeler(wide, 4, 0.9).relabel_with(buf, batch, u, 0.9, 2.0))
    with pytest.raises(ValueError, match=r"bit-goal layout"):
        her_relabel(*_args(buf, wide, index, obs, next_obs, u, 0.9, 1.0, 5, 0.8), backend="triton")


def test_empty_batch():
    buf, env = _ring(9, 3, 5, 31)
    empty = torch.zeros(0, 10)
    out = her_relabel(*_args(buf, env, torch.zeros(0, dtype=torch.int64), empty, empty, torch.rand(2, 0), 0.9,
                             1.0, 5, 0.8), backend="triton")
    assert out.obs.shape == (0, 10) and out.reward.shape == (0,) and out.discount.shape == (0,)


BAD = [
    (dict(episode=torch.zeros(9, 3)), r"episode must be int64 \[T, N\]"),
    (dict(ptr=torch.tensor([1])), r"ptr must be a 0-d int64"),
    (dict(ring_next_obs=torch.zeros(9, 2, 10)), r"ring_next_obs must be \[T=9, N=3, D\]"),
    (dict(index=torch.zeros(4, dtype=torch.int32)), r"index must be int64 \[R\]"),
    (dict(obs=torch.zeros(4, 9)), r"obs must be torch.float32 \[R=4, D=10\]"),
    (dict(obs=torch.zeros(2, 2, 10)), r"next_obs must have obs's shape"),
    (dict(u=torch.rand(2, 3)), r"u must be float32 \[2, R=4\] or \[P, 2, B\]"),
    (dict(gamma=torch.ones(3)), r"gamma must be a float or float32 \[G\] with G dividing R=4"),
    (dict(reward_scale=torch.ones(4, dtype=torch.float64)), r"reward_scale must be a float or float32"),
    (dict(window=0), r"window must be an int >= 1, got 0"),
    (dict(p_relabel=1.5), r"p_relabel must be a float in \[0, 1\], got 1.5"),
    (dict(env=object()), r"env must be goal-conditioned"),
]


@pytest.mark.parametrize("bad,match", BAD)
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_bad_arguments_raise(bad, match, backend):
    buf, env = _ring(9, 3, 5, 31)
    kw = dict(env=env, episode=buf.episode, ptr=buf.ptr, ring_next_obs=buf.next_obs,
              index=torch.zeros(4, dtype=torch.int64), obs=torch.zeros(4, 10), next_obs=torch.zeros(4, 10),
              u=torch.rand(2, 4), gamma=0.9, reward_scale=1.0, window=5, p_relabel=0.8)
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        her_relabel(*kw.values(), backend=backend)


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("members", [1, 4])
def test_gpu_kernel_equals_reference(members):
    buf, env = _ring(257, 8 * members, 15, written=700, seed=members, device="cuda")
    index, obs, next_obs = (x.cuda() for x in _batch(buf, members, 131, seed=0, stacked=members > 1))
    u = _uniforms(members, 131, seed=1, p_relabel=0.8).cuda()
    gamma, scale = (v.cuda() for v in _coefficients("members", members, members * 131))
    args = _args(buf, env, index, obs, next_obs, u, gamma, scale, 15, 0.8)
    _assert_same(her_relabel(*args, stacked=members > 1), her_relabel_reference(*args, stacked=members > 1))


@pytest.mark.gpu
def test_gpu_capture_replay_no_sync():
    buf, env = _ring(64, 16, 10, written=100, device="cuda")
    index, obs, next_obs = (x.cuda() for x in _batch(buf, 1, 128, seed=0, stacked=False))
    gen = torch.Generator(device="cuda").manual_seed(0)

    def step():
        u = torch.rand(2, 128, device="cuda", generator=gen)
        return u, her_relabel(*_args(buf, env, index, obs, next_obs, u, 0.9, 1.0, 10, 0.8))

    graph, (u, out) = capture_graph(step, generators=(gen,))
    for _ in range(3):
        buf.ptr.copy_((buf.ptr + 1) % 64)
        with no_host_sync():
            graph.replay()
        _assert_same(out, her_relabel_reference(*_args(buf, env, index, obs, next_obs, u, 0.9, 1.0, 10, 0.8)))
