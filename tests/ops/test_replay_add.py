"""replay_add: Triton kernel (interpreter) vs torch reference over several rows with ring
wrap-around, odd N and D, every obs dtype, reward scales per group, the regime column and the
rollout's obs advance; the ticket is zero after each call; argument checks; on the GPU the
compiled kernel, captured, and ReplayBuffer.add of the replay types on both backends."""
import pytest
import torch

from foxdqn.ops.replay_add import replay_add

F32, F64, I64, U8 = torch.float32, torch.float64, torch.int64, torch.uint8


def _buffers(rows, n, d, obs_dtype, vol, device):
    b = {"obs": torch.zeros(rows, n, d, dtype=obs_dtype), "next_obs": torch.zeros(rows, n, d, dtype=obs_dtype),
         "action": torch.zeros(rows, n, dtype=I64), "reward": torch.zeros(rows, n), "terminal": torch.zeros(rows, n),
         "ended": torch.zeros(rows, n), "episode": torch.zeros(rows, n, dtype=I64),
         "vol_ratio": torch.ones(rows, n) if vol else None}
    return {k: None if v is None else v.to(device) for k, v in b.items()}


def _counters(n, device, start_row=0):
    return (torch.zeros(n, dtype=I64, device=device), torch.tensor(start_row, device=device),
            torch.tensor(start_row, device=device), torch.zeros((), dtype=torch.int32, device=device))


def _obs(g, n, d, dtype):
    if dtype == U8:
        return torch.randint(0, 256, (n, d), generator=g, dtype=U8)
    return torch.randn(n, d, generator=g, dtype=dtype)


def _run(backend, rows, n, d, obs_dtype, in_dtype, reward_dtype, groups, vol, advance, steps, device="cpu"):
    g = torch.Generator().manual_seed(rows * 1000 + n * 10 + d)
    bufs = _buffers(rows, n, d, obs_dtype, vol, device)
    episode_now, ptr, written, ticket = _counters(n, device, start_row=rows - 2)  # wraps on the 3rd step
    obs = _obs(g, n, d, in_dtype if in_dtype != U8 else U8).to(device)
    scale = (torch.rand(groups, generator=g, dtype=F64) * 3).to(device)
    for _ in range(steps):
        next_obs = _obs(g, n, d, in_dtype).to(device)
        reset_obs = _obs(g, n, d, in_dtype).to(device)
        action = torch.randint(0, 45, (n,), generator=g).to(device)
        reward = torch.randn(n, generator=g, dtype=reward_dtype).to(device)
        term = (torch.rand(n, generator=g) < 0.3).to(device)
        trunc = (torch.rand(n, generator=g) < 0.3).to(device)
        vr = (torch.rand(n, generator=g) * 2).to(device) if vol else None
        replay_add(obs, next_obs, action, reward, scale, term, trunc, bufs, episode_now, ptr, written, ticket,
                   vol_ratio=vr, advance_obs=reset_obs if advance else None, backend=backend)
        assert int(ticket) == 0
    return bufs, episode_now, ptr, written, obs


def _compare(a, b):
    bufs_a, *rest_a = a
    bufs_b, *rest_b = b
    for k in bufs_a:
        if bufs_a[k] is None:
            assert bufs_b[k] is None
            continue
        assert bufs_a[k].dtype == bufs_b[k].dtype, k
        assert torch.equal(bufs_a[k], bufs_b[k]), k
    for name, x, y in zip(("episode_now", "ptr", "written", "obs"), rest_a, rest_b):
        assert x.dtype == y.dtype and torch.equal(x, y), name


@pytest.mark.parametrize("n,d,obs_dtype,in_dtype,reward_dtype,groups,vol,advance", [
    (1, 1, F32, F32, F32, 1, False, False),
    (17, 70, F32, F64, F64, 1, True, True),  # float64 env obs into float32 storage, regime column
    (33, 5, F64, F32, F32, 3, False, True),
    (20, 130, U8, U8, F32, 4, False, True),  # image-like uint8 obs, D over two blocks
])
def test_kernel_equals_reference_over_wrap_around(n, d, obs_dtype, in_dtype, reward_dtype, groups, vol, advance):
    args = (4, n, d, obs_dtype, in_dtype, reward_dtype, groups, vol, advance, 5)
    kern, ref = _run("triton", *args), _run("torch", *args)
    _compare(kern, ref)
    bufs, episode_now, ptr, written, _ = kern
    assert int(ptr) == (2 + 5) % 4 and int(written) == 2 + 5
    newest = (int(ptr) - 1) % 4
    assert torch.equal(bufs["episode"][newest] + bufs["ended"][newest].to(I64), episode_now)


def test_row_contents_and_reward_scale_per_group():
    n, d, rows = 6, 3, 3
    bufs = _buffers(rows, n, d, F32, False, "cpu")
    for backend in ("triton", "torch"):
        b = {k: None if v is None else v.clone() for k, v in bufs.items()}
        episode_now, ptr, written, ticket = _counters(n, "cpu", start_row=1)
        obs = torch.arange(n * d, dtype=F32).view(n, d)
        keep = obs.clone()
        nxt = -obs
        scale = torch.tensor([2.0, 10.0])  # envs 0..2 ×2, envs 3..5 ×10
        term = torch.tensor([True, False, False, False, True, False])
        trunc = torch.tensor([False, True, False, False, True, False])
        replay_add(obs, nxt, torch.arange(n), torch.ones(n), scale, term, trunc, b, episode_now, ptr, written,
                   ticket, advance_obs=nxt, backend=backend)
        assert torch.equal(b["obs"][1], keep) and torch.equal(b["next_obs"][1], -keep)
        assert torch.equal(obs, -keep)  # the rollout advanced after its obs was stored
        assert b["reward"][1].tolist() == [2.0] * 3 + [10.0] * 3
        assert b["terminal"][1].tolist() == [1, 0, 0, 0, 1, 0]
        assert b["ended"][1].tolist() == [1, 1, 0, 0, 1, 0]
        assert episode_now.tolist() == [1, 1, 0, 0, 1, 0] and b["episode"][1].tolist() == [0] * n
        assert b["action"][1].tolist() == list(range(n))
        assert int(ptr) == 2 and int(written) == 2
        assert float(b["reward"][0].abs().sum()) == 0.0 and float(b["reward"][2].abs().sum()) == 0.0


def test_rollout_of_another_width_advances_while_codes_are_stored():
    """The ring stores 4-value state codes while the rollout's observations (another width, 131 > one
    BLOCK_D, float64 into float32) advance in the same call: both backends alike, the stored rows are
    the codes, the rollout holds the next observations and the codes passed in are untouched."""
    n, d, width, rows = 19, 4, 131, 3
    out = []
    for backend in ("triton", "torch"):
        b = _buffers(rows, n, d, F32, False, "cpu")
        episode_now, ptr, written, ticket = _counters(n, "cpu")
        codes, next_codes = (torch.randn(n, d, generator=torch.Generator().manual_seed(k)) for k in (1, 2))
        rollout = torch.zeros(n, width)
        nxt_obs = torch.randn(n, width, dtype=F64, generator=torch.Generator().manual_seed(4))
        kept = codes.clone()
        replay_add(codes, next_codes, torch.zeros(n, dtype=I64), torch.ones(n), torch.ones(1),
                   torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool), b, episode_now, ptr, written,
                   ticket, advance_obs=nxt_obs, rollout=rollout, backend=backend)
        assert torch.equal(b["obs"][0], kept) and torch.equal(b["next_obs"][0], next_codes)
        assert torch.equal(codes, kept) and torch.equal(rollout, nxt_obs.to(F32))
        out.append(rollout)
    assert torch.equal(out[0], out[1])
    with pytest.raises(ValueError, match="rollout width"):
        replay_add(codes, next_codes, torch.zeros(n, dtype=I64), torch.ones(n), torch.ones(1),
                   torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool), b, episode_now, ptr, written,
                   ticket, advance_obs=nxt_obs, rollout=torch.zeros(n, width + 1))


def test_argument_errors():
    n, d = 4, 3
    bufs = _buffers(3, n, d, F32, False, "cpu")
    episode_now, ptr, written, ticket = _counters(n, "cpu")
    ok = dict(obs=torch.zeros(n, d), next_obs=torch.zeros(n, d), action=torch.zeros(n, dtype=I64),
              reward=torch.zeros(n), scale=torch.ones(1), terminated=torch.zeros(n, dtype=torch.bool),
              truncated=torch.zeros(n, dtype=torch.bool), buffers=bufs, episode_now=episode_now, ptr=ptr,
              written=written, ticket=ticket)
    for key, value, match in [("obs", torch.zeros(n, d + 1), "obs must be"),
                              ("action", torch.zeros(n, dtype=torch.int32), "action must be"),
                              ("scale", torch.ones(3), "scale must be"),
                              ("terminated", torch.zeros(n), "terminated must be"),
                              ("ticket", torch.zeros((), dtype=I64), "ticket must be")]:
        with pytest.raises(ValueError, match=match):
            replay_add(**{**ok, key: value})
    with pytest.raises(ValueError, match="vol_ratio"):
        replay_add(**ok, vol_ratio=torch.ones(n))
    with pytest.raises(ValueError, match="buffers\\['reward'\\]"):
        replay_add(**{**ok, "buffers": {**bufs, "reward": torch.zeros(3, n, dtype=F64)}})


@pytest.mark.gpu
def test_gpu_kernel_equals_reference_and_captures():
    from support import capture_graph

    args = (7, 4096, 162, F32, F32, F32, 1, True, True, 9)
    _compare(_run("auto", *args, device="cuda"), _run("torch", *args, device="cuda"))
    # many programs racing for the ticket: the counters advance once per call, also under replay
    n, d = 4096 * 4, 162
    bufs = _buffers(5, n, d, F32, False, "cuda")
    episode_now, ptr, written, ticket = _counters(n, "cuda")
    obs, nxt = torch.randn(n, d, device="cuda"), torch.randn(n, d, device="cuda")
    fields = (torch.zeros(n, dtype=I64, device="cuda"), torch.ones(n, device="cuda"), torch.ones(1, device="cuda"),
              torch.zeros(n, dtype=torch.bool, device="cuda"), torch.ones(n, dtype=torch.bool, device="cuda"))
    a, r, s, te, tr = fields
    graph, _ = capture_graph(lambda: replay_add(obs, nxt, a, r, s, te, tr, bufs, episode_now, ptr, written, ticket))
    for _ in range(7):
        graph.replay()
    torch.cuda.synchronize()
    assert int(written) == 3 + 7 and int(ptr) == (3 + 7) % 5 and int(ticket) == 0  # 3 warm-up calls, 7 replays
    assert bool((episode_now == 10).all())
