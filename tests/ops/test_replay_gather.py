"""foxdqn.ops.replay_gather: the Triton kernel (TRITON_INTERPRET=1 on CPU) against the torch
reference and against a per-row Python oracle of the n-step rules, on odd batch sizes, n = 1 and 3,
episode ends and terminals inside the window, a partly filled ring and a wrapped one, per-group γ,
members, given indices (PER; a population's [P, B]), stacked obs/next_obs, the three obs dtypes and bad arguments;
ReplayBuffer.sample_index's rows (the same rule) and its cached unit weights.
GPU (`gpu` marker): kernel = reference on CUDA, CUDA-graph capture."""
from __future__ import annotations

import pytest
import torch

import foxdqn.ops.replay_gather as rg
from foxdqn.ops.backend import INTERPRET
from foxdqn.ops.replay_gather import replay_gather, replay_gather_reference, stacked_pair
from foxdqn.replay.buffer import ReplayBuffer

from support import capture_graph, no_host_sync, require_compiled_kernels

_need_compiled = require_compiled_kernels(INTERPRET)

FIELDS = ("obs", "action", "reward", "next_obs", "discount", "index")


def _ring(rows, envs, dim, written, dtype=torch.float32, end_p=0.3, seed=0, device="cpu"):
    """A ReplayBuffer-shaped ring (dict of storage tensors) after ``written`` time rows were written:
    random obs (integers 0..250, exact in every dtype), actions, rewards, terminal ⊂ ended."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randint(0, 251, (rows, envs, dim), generator=g).to(dtype)
    next_obs = torch.randint(0, 251, (rows, envs, dim), generator=g).to(dtype)
    ended = (torch.rand(rows, envs, generator=g) < end_p).float()
    terminal = ended * (torch.rand(rows, envs, generator=g) < 0.5).float()
    ring = dict(obs=obs, next_obs=next_obs, action=torch.randint(0, 5, (rows, envs), generator=g),
                reward=torch.randn(rows, envs, generator=g), terminal=terminal, ended=ended,
                ptr=torch.tensor(written % rows), written=torch.tensor(written))
    return {k: v.to(device) for k, v in ring.items()}


def _gamma(groups, n, base=0.9, device="cpu"):
    g = base - 0.05 * torch.arange(groups, dtype=torch.float64)[:, None]
    return (g ** torch.arange(n + 1, dtype=torch.float64)[None]).float().to(device)


def _args(ring, gamma, n):
    return (ring["obs"], ring["next_obs"], ring["action"], ring["reward"], ring["terminal"], ring["ended"],
            ring["ptr"], ring["written"], gamma, n)


def _oracle(ring, gamma, n, index):
    """Per row, in Python: the n-step rules of the module docstring."""
    rows, envs, _ = ring["obs"].shape
    groups = gamma.shape[0]
    out = {k: [] for k in FIELDS}
    for i in index.tolist():
        t, e = divmod(i, envs)
        g = e // (envs // groups)
        ret, m = 0.0, 0
        for k in range(n):
            tk = (t + k) % rows
            ret += float(ring["reward"][tk, e]) * float(gamma[g, k])
            m += 1
            if ring["ended"][tk, e]:
                break
        last = (t + m - 1) % rows
        out["obs"].append(ring["obs"][t, e])
        out["action"].append(int(ring["action"][t, e]))
        out["reward"].append(ret)
        out["next_obs"].append(ring["next_obs"][last, e])
        out["discount"].append(float(gamma[g, m]) * (1.0 - float(ring["terminal"][last, e])))
        out["index"].append(i)
    return out


def _assert_same(a, b, reward_rtol=0.0):
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if name == "reward":
            torch.testing.assert_close(x, y, rtol=reward_rtol, atol=1e-6 if reward_rtol else 0.0)
        else:
            assert x.dtype == y.dtype and torch.equal(x, y), name


def _assert_oracle(res, ring, gamma, n):
    want = _oracle(ring, gamma, n, res.index)
    obs = res.obs.reshape(-1, res.obs.shape[-1])
    next_obs = res.next_obs.reshape(-1, res.next_obs.shape[-1])
    assert torch.equal(obs, torch.stack(want["obs"]))
    assert torch.equal(next_obs, torch.stack(want["next_obs"]))
    assert res.action.tolist() == want["action"]
    torch.testing.assert_close(res.reward, torch.tensor(want["reward"]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(res.discount, torch.tensor(want["discount"]), rtol=1e-6, atol=0)


# ------------------------------------------------------------------------------ uniform draws
CASES = [  # rows, envs, dim, written, n, members, batch per member
    pytest.param(9, 6, 5, 4, 1, 1, 37, id="partial-n1"),
    pytest.param(9, 6, 5, 5, 3, 1, 37, id="partial-n3"),
    pytest.param(9, 6, 5, 23, 3, 1, 33, id="wrapped-n3"),
    pytest.param(7, 6, 3, 16, 1, 2, 19, id="wrapped-n1-members"),
    pytest.param(8, 6, 7, 30, 3, 3, 5, id="wrapped-n3-members"),
    pytest.param(5, 1, 2, 2, 3, 1, 3, id="one-env-window-not-complete"),
]


@pytest.mark.parametrize("rows,envs,dim,written,n,members,b", CASES)
@pytest.mark.parametrize("stacked", [False, True])
def test_uniform_kernel_equals_reference_and_oracle(rows, envs, dim, written, n, members, b, stacked):
    ring = _ring(rows, envs, dim, written, seed=rows + written)
    gamma = _gamma(members, n)  # a γ per member (the population's tables)
    u = torch.rand(members, 2, b, generator=torch.Generator().manual_seed(1))
    u[0, :, 0] = 0.0
    u[-1, :, -1] = 1.0 - 2.0 ** -24  # the largest float32 below 1: the clamps at valid - 1, N/P - 1
    ref = replay_gather_reference(*_args(ring, gamma, n), uniforms=u, stacked=stacked)
    ker = replay_gather(*_args(ring, gamma, n), uniforms=u, stacked=stacked, backend="triton")
    _assert_same(ker, ref)
    _assert_oracle(ker, ring, gamma, n)
    # the rows drawn: member p's own envs, complete windows among the filled rows
    t, e = ker.index // envs, ker.index % envs
    per = envs // members
    assert torch.equal(e // per, torch.arange(members).repeat_interleave(b))
    filled = min(written, rows)
    age = (written % rows - 1 - t) % rows  # 0 = newest
    assert int(age.max()) < filled
    if filled >= n:
        assert int(age.min()) >= n - 1
    if stacked:
        assert ker.pair.shape == (members, 2, b, dim)
        assert stacked_pair(ker.obs, ker.next_obs) is ker.pair


def test_gpu_tiles_grow_with_the_batch():
    """On the GPU a single run's batch keeps BLOCK_B rows per program; a population's P·B rows take
    larger row blocks while the grid exceeds MAX_PROGRAMS (512 × 128 rows of 4 columns: 64 rows per
    program, 1,024 programs), within MAX_TILE elements per observation tile."""
    assert rg._blocks(256, 4, interpret=False) == (rg.BLOCK_B, 4)
    assert rg._blocks(512 * 128, 4, interpret=False) == (64, 4)
    assert rg._blocks(512 * 128, 162, interpret=False) == (16, 256)
    assert rg._blocks(rg.MAX_PROGRAMS * rg.BLOCK_B + 1, 4, interpret=False) == (2 * rg.BLOCK_B, 4)


@pytest.mark.parametrize("stacked", [False, True])
def test_gpu_tiling_gathers_the_same_bits(monkeypatch, stacked):
    """The kernel with the GPU's tiles (here MAX_PROGRAMS = 4: 32-row blocks over 3 × 37 rows, the
    last block partial) gives the reference's bits, as the interpreter's one-block tiling does."""
    ring = _ring(8, 6, 7, 30, seed=3)
    gamma = _gamma(3, 3)
    u = torch.rand(3, 2, 37, generator=torch.Generator().manual_seed(2))
    ref = replay_gather_reference(*_args(ring, gamma, 3), uniforms=u, stacked=stacked)
    monkeypatch.setattr(rg, "MAX_PROGRAMS", 4)
    seen = []
    monkeypatch.setattr(rg, "_blocks", lambda rows, d, interpret, real=rg._blocks: seen.append(real(rows, d, False))
                        or seen[-1])
    ker = replay_gather(*_args(ring, gamma, 3), uniforms=u, stacked=stacked, backend="triton")
    assert seen == [(32, 8)]
    _assert_same(ker, ref)


def test_uniform_rows_are_those_of_replay_buffer_sample_index():
    """The reference's row rule is ReplayBuffer.sample_index's, draw for draw."""
    buf = ReplayBuffer(capacity=7 * 4, num_envs=4, obs_dim=2, device=torch.device("cpu"), n_step=3, gamma=0.9)
    for step in range(11):  # wraps a ring of 7 rows
        buf.add(torch.full((4, 2), float(step)), torch.arange(4), torch.ones(4), torch.zeros(4, 2),
                torch.zeros(4, dtype=torch.bool), torch.tensor([False, step % 3 == 0, False, True]))
    want, _ = buf.sample_index(29, torch.Generator().manual_seed(5))
    u = torch.rand(2, 29, generator=torch.Generator().manual_seed(5))
    args = (buf.obs, buf.next_obs, buf.action, buf.reward, buf.terminal, buf.ended, buf.ptr, buf.written,
            buf._gamma_m[None], 3)
    for backend in ("torch", "triton"):
        assert torch.equal(replay_gather(*args, uniforms=u, backend=backend).index, want)


def test_sample_index_weights_are_ones_made_once():
    """sample_index's uniform weights: ones of the batch size, one tensor reused by later calls."""
    buf = ReplayBuffer(capacity=7 * 4, num_envs=4, obs_dim=2, device=torch.device("cpu"), n_step=1, gamma=0.9)
    for step in range(3):
        buf.add(torch.full((4, 2), float(step)), torch.arange(4), torch.ones(4), torch.zeros(4, 2),
                torch.zeros(4, dtype=torch.bool), torch.zeros(4, dtype=torch.bool))
    g = torch.Generator().manual_seed(0)
    _, w1 = buf.sample_index(9, g)
    _, w2 = buf.sample_index(9, g)
    assert w1 is w2 and w1.dtype == torch.float32 and torch.equal(w1, torch.ones(9))
    _, w3 = buf.sample_index(5, g)
    assert torch.equal(w3, torch.ones(5)) and torch.equal(w1, torch.ones(9))  # the old tensor is not rewritten


# ------------------------------------------------------------------------------ given rows, dtypes
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.uint8])
@pytest.mark.parametrize("n", [1, 3])
def test_index_kernel_equals_reference_and_oracle(dtype, n):
    rows, envs, dim = 6, 5, 300  # an odd D
    ring = _ring(rows, envs, dim, written=13, dtype=dtype, end_p=0.4, seed=n)
    gamma = _gamma(1, n, base=0.97)
    index = torch.tensor([0, 29, 7, 14, 14, 3, 22, 25, 11, 1, 28])  # includes wrap-around windows, repeats
    for stacked in (False, True):
        ref = replay_gather_reference(*_args(ring, gamma, n), index=index, stacked=stacked)
        ker = replay_gather(*_args(ring, gamma, n), index=index, stacked=stacked, backend="triton")
        _assert_same(ker, ref)
        _assert_oracle(ker, ring, gamma, n)
        assert ker.obs.dtype == dtype and ker.obs.shape == (len(index), dim)


@pytest.mark.parametrize("n", [1, 3])
def test_member_index_kernel_equals_reference_and_oracle(n):
    """index [P, B] (a population's PER rows, each member's own columns): the rows as given,
    member-major, each member's own γ; stacked: pair [P, 2, B, D] that the member loss takes."""
    rows, envs, dim, members, b = 7, 6, 5, 3, 7
    ring = _ring(rows, envs, dim, written=17, end_p=0.4, seed=n + 10)
    gamma = _gamma(members, n)
    g = torch.Generator().manual_seed(n)
    t = torch.randint(0, rows, (members, b), generator=g)
    e = torch.randint(0, envs // members, (members, b), generator=g) + 2 * torch.arange(members)[:, None]
    index = t * envs + e
    for stacked in (False, True):
        ref = replay_gather_reference(*_args(ring, gamma, n), index=index, stacked=stacked)
        ker = replay_gather(*_args(ring, gamma, n), index=index, stacked=stacked, backend="triton")
        _assert_same(ker, ref)
        _assert_oracle(ker, ring, gamma, n)
        assert torch.equal(ker.index, index.view(-1))
        if stacked:
            assert ker.pair.shape == (members, 2, b, dim) and stacked_pair(ker.obs, ker.next_obs) is ker.pair
            assert ker.obs.shape == (members, b, dim)
    with pytest.raises(ValueError, match=r"index must be int64 \[B\] or \[P, B\] with P dividing N=6"):
        replay_gather(*_args(ring, gamma, n), index=torch.zeros(4, 2, dtype=torch.int64))


def test_episode_end_inside_the_window_by_hand():
    """One env, n = 3, γ = 0.5: ended at row 1 (truncated), terminal at row 3."""
    rows = 6
    ring = _ring(rows, 1, 1, written=6, end_p=0.0)
    ring["reward"][:, 0] = torch.tensor([1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    ring["ended"][:, 0] = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    ring["terminal"][:, 0] = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    ring["next_obs"][:, 0, 0] = torch.arange(rows, dtype=torch.float32) + 0.5
    gamma = _gamma(1, 3, base=0.5)
    for backend in ("torch", "triton"):
        res = replay_gather(*_args(ring, gamma, 3), index=torch.tensor([0, 1, 2, 3, 4, 5]), backend=backend)
        # t=0: 1 + .5·2 (ended at 1), bootstrap γ² from 1.5; t=1: 2, γ; t=2: 4 + .5·8, terminal at 3 → 0
        # t=3: 8, terminal → 0; t=4: 16 + .5·32 + .25·1 (wraps to row 0), γ³ from 0.5; t=5: 32 + .5·1 + .25·2
        assert res.reward.tolist() == [2.0, 2.0, 8.0, 8.0, 32.25, 33.0]
        assert res.discount.tolist() == [0.25, 0.5, 0.0, 0.0, 0.125, 0.125]
        assert res.next_obs[:, 0].tolist() == [1.5, 1.5, 3.5, 3.5, 0.5, 1.5]


def test_empty_batch():
    ring = _ring(4, 2, 3, written=4)
    res = replay_gather(*_args(ring, _gamma(1, 1), 1), uniforms=torch.rand(2, 0), backend="triton")
    assert res.obs.shape == (0, 3) and res.index.shape == (0,)


def test_stacked_pair_rejects_chunks_and_copies():
    ring = _ring(5, 2, 3, written=5)
    res = replay_gather(*_args(ring, _gamma(1, 1), 1), uniforms=torch.rand(2, 8), stacked=True)
    assert stacked_pair(res.obs, res.next_obs) is res.pair
    assert stacked_pair(res.obs[:4], res.next_obs[:4]) is None
    assert stacked_pair(res.obs.clone(), res.next_obs) is None
    assert stacked_pair(res.next_obs, res.obs) is None


@pytest.mark.parametrize("change,match", [
    (dict(n=0), "n_step must be an int >= 1"),
    (dict(n=5), r"at least n_step \+ 1 = 6 time rows"),
    (dict(gamma=torch.ones(1, 3)), r"gamma must be float32 \[G, n_step \+ 1 = 2\]"),
    (dict(gamma=torch.ones(4, 2)), "G dividing N=6"),
    (dict(uniforms=torch.rand(4, 2, 3)), r"uniforms must be float32 \[2, B\] or \[P, 2, B\] with P dividing N=6"),
    (dict(uniforms=None), "exactly one of uniforms"),
    (dict(index=torch.zeros(3, dtype=torch.int64)), "exactly one of uniforms"),
    (dict(reward=torch.zeros(5, 6, dtype=torch.float64)), r"reward must be torch.float32 \[5, 6\]"),
    (dict(obs=torch.zeros(5, 6, 2, dtype=torch.int32)), "obs must be .* float32, float64 or uint8"),
])
def test_bad_arguments(change, match):
    ring = _ring(5, 6, 2, written=5)
    kw = dict(n=1, gamma=_gamma(1, 1), uniforms=torch.rand(2, 3), index=None)
    kw.update(change)
    for key in ("reward", "obs"):
        if key in change:
            ring[key] = change[key]
    with pytest.raises(ValueError, match=match):
        replay_gather(*_args(ring, kw["gamma"], kw["n"]), uniforms=kw["uniforms"], index=kw["index"])


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_gpu_kernel_equals_reference(n, dtype):
    ring = _ring(257, 96, 162, written=1000, dtype=dtype, device="cuda", seed=n)
    gamma = _gamma(4, n, device="cuda")
    u = torch.rand(4, 2, 131, device="cuda")
    for stacked in (False, True):
        ref = replay_gather_reference(*_args(ring, gamma, n), uniforms=u, stacked=stacked)
        ker = replay_gather(*_args(ring, gamma, n), uniforms=u, stacked=stacked)
        _assert_same(ker, ref, reward_rtol=1e-6)  # the GPU may contract multiply-adds


@pytest.mark.gpu
def test_gpu_capture_replay_no_sync():
    ring = _ring(64, 32, 40, written=100, device="cuda")
    gamma = _gamma(1, 3, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)

    def step():
        u = torch.rand(2, 128, device="cuda", generator=gen)
        return u, replay_gather(*_args(ring, gamma, 3), uniforms=u, stacked=True)

    graph, (u, out) = capture_graph(step, generators=(gen,))
    for _ in range(3):
        ring["written"].add_(1)
        ring["ptr"].copy_(ring["written"] % 64)
        with no_host_sync():
            graph.replay()
        _assert_same(out, replay_gather_reference(*_args(ring, gamma, 3), uniforms=u, stacked=True),
                     reward_rtol=1e-6)
