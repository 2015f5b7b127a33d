"""trading_observation: the trading step's state codes decode to the observations the step returned,
bit for bit (kernel in the interpreter and torch reference, on CPU; compiled on the GPU), and the
kernel equals the reference at odd shapes, with per-row parameter groups and clamped bar indices;
with members, a population's pair [P, 2, B/P, D] holding each member's rows as a decode of its own.
docs/design/replay.md#windowed-trading-replay."""
import pytest
import torch

from foxdqn.execution.orders import FLAT, MARKET, NUM_ACTIONS, compose
from foxdqn.ops.trading_code import CODE_T, CODE_WIDTH, state_code_dtype
from foxdqn.ops.trading_observation import trading_observation
from foxdqn.ops.trading_step import _RUIN, TradingState, observation_reference, trading_step

from test_trading_step import F32, F64, I64, _clone, _market, _params, _state

BACKENDS = ("torch", "triton")


def _assert_decodes(codes, expected, m, p, where):
    """Each backend decodes ``codes`` to ``expected`` (env dtype) and to ``expected`` rounded to float32."""
    for backend in BACKENDS:
        for out_dtype in (m.close.dtype, F32):
            got = trading_observation(codes, None, m, p, out_dtype, backend=backend)
            assert len(got) == len(expected)
            for k, (a, e) in enumerate(zip(got, expected)):
                e = e.to(out_dtype)
                assert a.dtype == out_dtype and a.shape == e.shape, f"{where} {backend} [{k}]"
                assert torch.equal(a, e), f"{where} {backend} {out_dtype} [{k}]: not bit-equal"


@pytest.mark.parametrize("dtype", [F32, F64])
def test_codes_of_random_steps_decode_to_the_step_observations(dtype):
    """19 random accounts (some at the first valid bar, some a step from the split's end or from
    ruin, equity at or below the floor), 4 steps with every action and random reset starts: the
    kernel's codes equal the reference's, the code of the state stepped from decodes to the
    observation acted on, and next_code to next_obs."""
    n = 19  # more than one program of 16 rows
    m = _market(48, 2, 2, dtype)
    p = _params(m, dtype, 3, 6, False)
    st = _state(n, m, p, 2, dtype)
    ks, rs = _clone(st), _clone(st)
    obs = observation_reference(m, p, rs.t, rs.units, rs.entry_price, rs.equity)
    g = torch.Generator().manual_seed(4)
    ended = terminated = 0
    for k in range(4):
        action = (torch.arange(n) + torch.randint(0, NUM_ACTIONS, (), generator=g)) % NUM_ACTIONS
        starts = torch.randint(p.first_valid, p.last_bar, (n,), generator=g)
        ko = trading_step(ks, action, starts, m, p, backend="triton")
        ro = trading_step(rs, action, starts, m, p, backend="torch")
        for name in ("code", "next_code"):
            a, e = getattr(ko, name), getattr(ro, name)
            assert a.dtype == e.dtype == state_code_dtype(dtype, 48) and a.shape == (n, CODE_WIDTH), name
            assert torch.equal(a, e), f"step {k}: {name}"
        _assert_decodes((ro.code, ro.next_code), (obs, ro.next_obs), m, p, f"step {k}")
        obs = ro.obs
        ended += int(ro.done.sum())
        terminated += int(ro.terminated.sum())
    assert ended > terminated > 0  # resets after episode ends and after ruin were decoded


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("split", [None, (20, 60)])
def test_split_edges_ruin_and_reset(dtype, split):
    """Accounts at the first valid bar (its window starts at row 0, or before a split that starts
    later), one bar before the split's last bar (s' at the last bar, truncated), a 1000x long
    ruined on the step, and a flat one; resets to the first valid bar and to the last start bar:
    both codes of the step, and the code of the reset state on the next step, decode exactly."""
    window, T = 3 if split is None else 4, 70
    m = _market(T, 3, 8, dtype)
    p = _params(m, dtype, window, 50, False, split)
    close = m.close.double()
    falls = torch.nonzero(close[p.first_valid + 1:p.last_bar - 1] < close[p.first_valid:p.last_bar - 2] * 0.999)
    t_ruin = p.first_valid + int(falls[0])  # close falls by more than 0.1 % on the next bar
    t = torch.tensor([p.first_valid, p.last_bar - 1, t_ruin, p.first_valid + 1])
    one = torch.ones(4, dtype=dtype)
    units = torch.zeros(4, dtype=dtype)
    units[2] = 1000.0 / m.close[t_ruin]
    entry = torch.where(units != 0, m.close[t], torch.zeros((), dtype=dtype))
    cash = one - units * m.close[t]
    expo = torch.tensor([FLAT, FLAT, 4, FLAT])
    st = TradingState(t, torch.zeros(4, dtype=I64), cash, units, entry, one.clone(), expo, torch.zeros(4, dtype=dtype),
                      torch.zeros(4, dtype=torch.bool))
    obs = observation_reference(m, p, st.t, st.units, st.entry_price, st.equity)
    action = torch.tensor([compose(FLAT, MARKET, 0), compose(FLAT, MARKET, 0), compose(4, MARKET, 0),
                           compose(3, MARKET, 1)])
    starts = torch.tensor([p.last_bar - 1, p.first_valid, p.first_valid, p.last_bar - 2])
    ks, rs = _clone(st), _clone(st)
    ko = trading_step(ks, action, starts, m, p, backend="triton")
    ro = trading_step(rs, action, starts, m, p, backend="torch")
    assert ro.truncated.tolist() == [False, True, False, False]
    assert ro.terminated.tolist() == [False, False, True, False]
    assert int(ro.next_code[1, CODE_T]) == p.last_bar and rs.t.tolist()[1:3] == [p.first_valid, p.first_valid]
    assert torch.equal(ko.code, ro.code) and torch.equal(ko.next_code, ro.next_code)
    _assert_decodes((ro.code, ro.next_code), (obs, ro.next_obs), m, p, "step")
    ro2 = trading_step(rs, action, starts, m, p, backend="torch")  # from the reset states
    _assert_decodes((ro2.code,), (ro.obs,), m, p, "after reset")


def _random_codes(b, m, p, seed, code_dtype):
    """``b`` codes with bars across the table (and two outside it), signed positions, entries, and
    equities around both groups' ruin floors (0, negative, tiny)."""
    g = torch.Generator().manual_seed(seed)
    T = m.close.shape[0]
    t = torch.randint(p.window - 1, T, (b,), generator=g).to(code_dtype)
    if b >= 4:
        t[0], t[1] = 0.0, float(T + 5)  # clamped into [W-1, T-1]
    dt = m.close.dtype
    units = (torch.randn(b, generator=g, dtype=F64) * 0.01).to(dt)
    entry = (torch.rand(b, generator=g, dtype=F64) * 100 + 50).to(dt)
    equity = torch.exp(torch.randn(b, generator=g, dtype=F64) * 2).to(dt)
    if b >= 4:
        equity[2], equity[3] = 0.0, -0.5
    return torch.stack([t, units.to(code_dtype), entry.to(code_dtype), equity.to(code_dtype)], dim=1).contiguous()


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("b", [1, 17])
def test_kernel_matches_reference_odd_shapes_and_groups(dtype, b):
    """W*F = 80 > CHUNK (two gather iterations, the second partial), 1 or 17 rows, one or two code
    tensors, bar indices outside the table clamped alike, and per-row parameter groups (G = 2, a
    second ruin floor of 0.5 that changes some rows): the kernel equals the reference bit for bit."""
    m = _market(70, 2, 5, dtype)
    p = _params(m, dtype, 40, 10, False)
    second = p.fparams.clone()
    second[0, _RUIN] = 0.5
    p2 = p._replace(fparams=torch.cat([p.fparams, second]).contiguous())
    code_dtype = state_code_dtype(dtype, 70)
    a, c = _random_codes(b, m, p, 1, code_dtype), _random_codes(b, m, p, 2, code_dtype)
    group = torch.arange(b, dtype=I64) % 2
    for codes in ((a,), (a, c)):
        for params, grp in ((p, None), (p2, group)):
            for out_dtype in (dtype, F32):
                ref = trading_observation(codes, grp, m, params, out_dtype, backend="torch")
                ker = trading_observation(codes, grp, m, params, out_dtype, backend="triton")
                for x, y in zip(ker, ref):
                    assert x.shape == (b, 82) and torch.equal(x, y), f"{len(codes)} codes, group={grp is not None}"
    if b == 17:
        flat, = trading_observation((a,), None, m, p, dtype, backend="torch")
        grouped, = trading_observation((a,), group, m, p2, dtype, backend="torch")
        assert not torch.equal(flat, grouped)  # the second group's floor was read
    empty = trading_observation((a[:0], c[:0]), None, m, p, F32, backend="triton")
    assert [x.shape for x in empty] == [(0, 82), (0, 82)]
    if b == 17:  # the kernel's two halves are the replay's stacked pair (no concatenation before a forward)
        from foxdqn.ops.replay_gather import stacked_pair

        o, n = trading_observation((a, c), None, m, p, F32, backend="triton")
        pair = stacked_pair(o, n)
        assert pair is not None and pair.shape == (1, 2, b, 82) and torch.equal(pair.view(2 * b, -1), torch.cat([o, n]))


@pytest.mark.parametrize("members,rows", [(1, 5), (3, 1), (3, 7), (4, 17)])
def test_members_decode_into_the_populations_stacked_pair(members, rows):
    """``members=P``: both backends give ``[P, B/P, D]`` observations (``[B, D]`` for P = 1) whose
    member p rows are the decode of member p's codes alone, bit for bit; the kernel's two are the
    halves of one ``[P, 2, B/P, D]`` pair (the replay's stacked pair: a forward reads it without a
    concatenation); one code tensor works too; groups per row."""
    from foxdqn.ops.replay_gather import stacked_pair

    m = _market(70, 2, 5, F32)
    p = _params(m, F32, 40, 10, False)
    second = p.fparams.clone()
    second[0, _RUIN] = 0.5
    p2 = p._replace(fparams=torch.cat([p.fparams, second]).contiguous())
    b = members * rows
    a, c = _random_codes(b, m, p, 1, F32), _random_codes(b, m, p, 2, F32)
    group = torch.arange(b, dtype=I64) // rows % 2  # member p's rows in group p % 2
    shape = (b, 82) if members == 1 else (members, rows, 82)
    for backend in BACKENDS:
        o, n = trading_observation((a, c), group, m, p2, F32, backend=backend, members=members)
        assert o.shape == n.shape == shape
        for q in range(members):
            sl = slice(q * rows, (q + 1) * rows)
            alone = trading_observation((a[sl], c[sl]), group[sl], m, p2, F32, backend=backend)
            assert torch.equal(o.reshape(b, 82)[sl], alone[0]) and torch.equal(n.reshape(b, 82)[sl], alone[1]), q
        one, = trading_observation((a,), group, m, p2, F32, backend=backend, members=members)
        assert torch.equal(one, o)
        if backend == "triton":
            pair = stacked_pair(o, n)
            assert pair is not None and pair.shape == (members, 2, rows, 82)
            assert torch.equal(pair.view(members, 2 * rows, 82),
                               torch.cat([o.reshape(members, rows, 82), n.reshape(members, rows, 82)], dim=1))
    with pytest.raises(ValueError, match="members must be None or an int >= 1 dividing B"):
        trading_observation((a,), None, m, p, members=b + 1)


def test_code_dtype_holds_the_state_exactly():
    assert state_code_dtype(F32, 2**24) == F32  # every bar index < 2**24 is a float32 integer
    assert state_code_dtype(F32, 2**24 + 1) == F64
    assert state_code_dtype(F64, 10) == F64
    with pytest.raises(ValueError, match="float32 or float64"):
        state_code_dtype(torch.float16, 10)


def test_argument_checks():
    m = _market(20, 2, 0, F64)
    p = _params(m, F64, 2, 5, False)
    code = _random_codes(4, m, p, 0, F64)
    with pytest.raises(ValueError, match="one or two"):
        trading_observation((code, code, code), None, m, p)
    with pytest.raises(ValueError, match=r"codes\[0\]"):
        trading_observation((code[:, :3].contiguous(),), None, m, p)
    with pytest.raises(ValueError, match=r"codes\[1\]"):
        trading_observation((code, code.float()), None, m, p)
    with pytest.raises(ValueError, match="group"):
        trading_observation((code,), torch.zeros(4, dtype=torch.int32), m, p)
    with pytest.raises(ValueError, match="out_dtype"):
        trading_observation((code,), None, m, p, torch.int64)
    with pytest.raises(ValueError, match="backend"):
        trading_observation((code,), None, m, p, backend="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F64, F32])
def test_gpu_env_codes_decode_to_the_observations_on_eurusd(dtype):
    """4,096 envs on EURUSD 1h (window 32, episodes of 64 bars, so that every env auto-resets at
    least once), 100 random steps stepped by the compiled kernel: the
    compiled decode and the reference decode of each step's codes give the float32 observations the
    env returned (acted on and s'), bit for bit."""
    from test_trading_step import _eurusd_envs

    env, _ = _eurusd_envs(dtype, episode_length=64)
    obs = env.reset_all().float()
    index = torch.arange(env.num_envs, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(5)
    ends = 0
    for k in range(100):
        out = env.step(torch.randint(0, NUM_ACTIONS, (env.num_envs,), generator=g, device="cuda"))
        for backend in BACKENDS:
            env.decode_backend = backend
            o, n = env.decode_observations(out.info["state_code"], out.info["next_state_code"], index)
            assert torch.equal(o, obs), f"step {k} {backend}: obs"
            assert torch.equal(n, out.next_obs.float()), f"step {k} {backend}: next_obs"
        obs = out.obs.float()
        ends += int(out.info["episode_done"].sum())
    assert ends > 0
