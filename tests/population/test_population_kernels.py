"""Kernel launches of a population's steps, counted on the CPU (bench/cpu_kernels.py: inside
foxdqn.ops.backend.cpu_kernels every op runs its Triton kernel in the interpreter and the networks
take their fused forwards, as on CUDA), so that a change which adds launches fails here (issue 33):
a collect step is the single run's six launches whatever P, an update adds none outside its loss
and backward; the collect step's fused action selection of a plain Q head; and a C51, IQN or
branching population's collect step: its encoder's layers, then one kernel for its head and the
ε-greedy selection (foxdqn/ops/{c51,iqn,branching}_epsilon_greedy.py); a C51, Rainbow-like, controls,
IQL, branching or IQN population's update: at most a bound (IQL's loss one kernel, foxdqn/ops/iql_loss.py;
BDQ's, foxdqn/ops/branching_loss.py; IQN's, foxdqn/ops/iqn_loss.py)."""
from __future__ import annotations

import functools
from collections import Counter

import pytest
import torch

if torch.cuda.is_available():  # counting runs the kernels in the interpreter: CPU sessions only
    pytest.skip("launches are counted on the CPU (TRITON_INTERPRET=1); bench kernels counts them on CUDA",
                allow_module_level=True)

from bench.cpu_kernels import step_launches
from foxdqn.ops import backend as B
from foxdqn.step import act as act_mod
from foxdqn.step.act import act
from foxdqn.ops.epsilon_greedy import epsilon_greedy
from foxdqn.population.state import build_population

from test_population import CARTPOLE, configs

# a single run's collect step: the explore uniforms, the fused forward + ε-greedy, the env's start
# draws, its step, the replay row, the monitor sums (bench/results/*kernels-issue33*.md: 6 on the H200)
COLLECT = ["triton::_member_uniform_kernel", "{act}", "triton::_member_uniform_kernel",
           "{step}", "triton::_replay_add_kernel", "triton::_step_stats_kernel"]
# an update, outside the loss and its backward: the draws, the gather (and the trading env's
# decode), then the gradient norm (none where the chain's backward leaves it: CHAIN_NORM), the guard
# with the monitor sums, Adam with the Polyak target update in its launch (population/step.py
# target_follow), or Adam and the target update
UPDATE_HEAD = ["triton::_member_uniform_kernel", "triton::_replay_gather_kernel"]
GRAD_NORM = "triton::_grad_norm_kernel"
UPDATE_TAIL = ["triton::_member_guard_kernel", "triton::_adam_step_kernel"]
#: the experiments whose gradient norm and clip coefficient the online MLP chain's weight-gradient
#: kernel leaves (population/state.py chain_grad_norm: a plain Q head on an MLP of ReLUs, trained
#: alone), at the small widths of bench.cpu_kernels.small_overrides (bitflip_her's shipped 256
#: units are over the chain's 128: its layers run and grad_norm launches): no launch of its own
CHAIN_NORM = {"cartpole_cleanrl", "bitflip_her"}
#: the experiments whose target update is a launch of its own after Adam: the hard copy
#: (cartpole_cleanrl), IQL's V trained by the same Adam (no target of its own), pruning masks
#: between Adam and the target update (controls)
SEPARATE_TARGET_UPDATE = {"cartpole_cleanrl", "eurusd_iql", "eurusd_controls"}


def update_tail(name: str) -> list[str]:
    """The last launches of experiment ``name``'s update: the gradient norm (not in
    :data:`CHAIN_NORM`), :data:`UPDATE_TAIL`, then the target update's where it has one of its own
    (:data:`SEPARATE_TARGET_UPDATE`)."""
    return ([] if name in CHAIN_NORM else [GRAD_NORM]) + UPDATE_TAIL \
        + (["triton::_target_lerp_kernel"] if name in SEPARATE_TARGET_UPDATE else [])
#: the loss, forwards and backward of each experiment's small network (population/objective.py, untouched
#: here): counted whole, so that a change elsewhere cannot hide in them (eurusd_dqn 16 with its dueling
#: head's layers: 8 with ops/member_dueling_head.py)
LOSS = {"cartpole_cleanrl": 5, "eurusd_dqn": 8}
#: cartpole_cleanrl's loss: the online forward of [s; s'] and the target's of s' in member_mlp_chain
#: (one kernel each), the TD loss, the chain's backward (two kernels); the TD loss's backward is its
#: saved gradient itself (the members' losses are back-propagated with a [P] seed of ones, no sum and
#: no ones_like: foxdqn.device.scalars.is_ones_vector; one multiply by it before); its layers
#: (baddbmm, relu, bmm, threshold_backward, bias sums) ran 22 launches (24 at P = 1) before
CARTPOLE_LOSS = ["triton::_member_forward_kernel", "triton::_member_forward_kernel", "triton::_dqn_td_loss_kernel",
                 "triton::_member_dz_kernel", "triton::_member_wgrad_kernel"]
STEP = {"cartpole_cleanrl": "triton::_cartpole_step_kernel", "eurusd_dqn": "triton::_trading_step_kernel"}
#: the fused forward + ε-greedy: a plain head's member MLP chain (ops/member_mlp_chain_epsilon_greedy.py),
#: a dueling head's q_forward (ops/q_forward_epsilon_greedy.py)
ACT = {"cartpole_cleanrl": "triton::_member_forward_kernel", "eurusd_dqn": "triton::_q_forward_kernel"}


@pytest.fixture(scope="module", params=["cartpole_cleanrl", "eurusd_dqn"])
def launches(request):
    return request.param, step_launches(request.param, 3)


def test_collect_step_is_the_single_runs_six_launches(launches):
    name, ops = launches
    assert ops["collect"] == [op.format(step=STEP[name], act=ACT[name]) for op in COLLECT]


def test_update_adds_no_launch_outside_its_loss(launches):
    name, ops = launches
    head = UPDATE_HEAD + (["triton::_trading_observation_kernel"] if name == "eurusd_dqn" else [])
    update = ops["update"]
    tail = update_tail(name)
    assert update[:len(head)] == head and update[-len(tail):] == tail, update
    loss = update[len(head):-len(tail)]
    assert len(loss) <= LOSS[name], loss
    assert not {"aten::cat", "aten::isfinite", "aten::where", "aten::nan_to_num", "aten::stack", "aten::max",
                "aten::copy_"} & set(loss), Counter(loss)  # the guard, the stats, the decode's concatenation
    assert "aten::item" not in update and "aten::_local_scalar_dense" not in update  # no host read
    if name == "cartpole_cleanrl":  # the member MLP chain: its layers' launches must not come back
        assert loss == CARTPOLE_LOSS, loss


def test_dueling_head_kernels_cut_the_update(launches, monkeypatch):
    """network.DUELING_HEAD_KERNELS (on): eurusd_dqn's update runs its dueling head as
    ops/member_dueling_head.py's three kernels, 8 launches fewer than its layers (the switch off)."""
    from foxdqn.population import network

    name, ops = launches
    if name != "eurusd_dqn":
        pytest.skip("a plain Q head")
    fused = ops["update"]
    monkeypatch.setattr(network, "DUELING_HEAD_KERNELS", False)
    layers = step_launches(name, 3)["update"]
    heads = ["triton::_dueling_head_forward_kernel", "triton::_dueling_head_dx_kernel", "triton::_dueling_head_dw_kernel"]
    assert [fused.count(k) for k in heads] == [1, 1, 1] and not {"aten::baddbmm", "aten::add_"} & set(fused), fused
    assert len(layers) - len(fused) == 8 and not [o for o in layers if "dueling_head" in o], layers


@pytest.mark.slow
def test_launches_do_not_grow_with_members():
    """The same launches for 2 and 5 members (P = 1 differs on the CPU alone: its layers run as a
    batch of two there, MemberQNetwork.layer; its collect step and the update's tail are the same)."""
    one, two, five = (step_launches("cartpole_cleanrl", p) for p in (1, 2, 5))
    assert two == five
    tail = update_tail("cartpole_cleanrl")
    assert one["collect"] == two["collect"] and one["update"][-len(tail):] == two["update"][-len(tail):] == tail
    assert one["update"] == two["update"]  # the fused member chain: P = 1 runs no CPU batch-of-two layers


@pytest.mark.parametrize("name", ["bitflip_dqn", "bitflip_her"])
def test_bitflip_collect_step_is_the_single_runs_six_launches(name):
    """Bit flipping's env step, start draw and auto-reset are one kernel (ops/bitflip_step.py; were
    37 torch ops, 43 launches per collect step at P = 3), HER's collect step the same six."""
    from bench.cpu_kernels import launches, small_overrides
    from bench.harness import make_population
    from foxdqn.population.step import collect_step

    s = make_population([f"+experiment={name}", *small_overrides(name)], 3, "cpu")
    # the small network of small_overrides acts through the member chain (the shipped 256-wide one
    # through its layers and the ε-greedy kernel: test_a_wide_plain_head_acts_through_its_layers)
    assert launches(lambda: collect_step(s)) == [op.format(step="triton::_bitflip_step_kernel",
                                                           act="triton::_member_forward_kernel") for op in COLLECT]


def test_collect_step_fuses_a_plain_q_head():
    """A plain Q head (CartPole) acts through member_mlp_chain_epsilon_greedy (acting_chain_args)
    where the fused forwards run, the chain its forward runs too (q_forward_args None); the actions
    are epsilon_greedy's of that Q, bit for bit; on the CPU outside cpu_kernels nothing is fused."""
    s = build_population(configs(CARTPOLE, [["seed=0"], ["seed=1"], ["seed=2"]]), None, torch.device("cpu"))
    net, p = s.online, s.members
    obs = torch.randn(p, 40, 4, generator=torch.Generator().manual_seed(0))
    step = torch.tensor(50)
    u = torch.rand(p, 2, 40, generator=torch.Generator().manual_seed(1))
    sched = (s.params.eps_start, s.params.eps_end, s.eps_duration, u)
    assert net.acting_chain_args(obs) is None and net.q_forward_args(obs) is None and net.chain_args(obs) is None
    calls = []
    real = act_mod.member_mlp_chain_epsilon_greedy
    with torch.no_grad(), B.cpu_kernels():
        assert net.q_forward_args(obs) is None and net.acting_chain_args(obs)[0] == list(net.weights)
        act_mod.member_mlp_chain_epsilon_greedy = lambda *a, **k: calls.append(1) or real(*a, **k)
        try:
            got = act(net, obs, step, *sched)
        finally:
            act_mod.member_mlp_chain_epsilon_greedy = real
        q = net(obs)
        want = epsilon_greedy(q.reshape(-1, q.shape[-1]), step, *sched, backend="triton")
    assert calls == [1]
    assert torch.equal(got, want)


def test_a_wide_plain_head_acts_through_its_layers():
    """bitflip_dqn's shipped network (60 → 256 → 30, wider than the member chain's 128): act()
    runs its layers, then the ε-greedy kernel (not q_forward_epsilon_greedy, which measured up to
    15 times slower at 16 rows per member on the H200: docs/bench.md#kernels); the actions are
    epsilon_greedy's of the network's Q."""
    from bench.harness import make_population
    from bench.cpu_kernels import launches

    s = make_population(["+experiment=bitflip_dqn", "env.num_envs=4"], 2, "cpu")
    obs = torch.randn(2, 4, s.online.weights[0].shape[1], generator=torch.Generator().manual_seed(0))
    u = torch.rand(2, 2, 4, generator=torch.Generator().manual_seed(1))
    sched = (torch.tensor(7), s.params.eps_start, s.params.eps_end, s.eps_duration, u)
    with torch.no_grad(), B.cpu_kernels():
        assert s.online.acting_chain_args(obs) is None and s.online.q_forward_args(obs) is None
        ops = launches(lambda: act(s.online, obs, *sched))
        got = act(s.online, obs, *sched)
        q = s.online(obs)
    assert ops[-1] == "triton::_epsilon_greedy_kernel" and "triton::_q_forward_kernel" not in ops, ops
    assert torch.equal(got, epsilon_greedy(q.reshape(-1, q.shape[-1]), *sched, backend="triton"))


#: the small trading network's encoder (bench/cpu_kernels.py SMALL: model.hidden=[16], one hidden layer)
ENCODER = ["triton::_member_linear_kernel"]  # the bias and ReLU in its epilogue (ops/member_linear.py; were baddbmm + relu)
ENV_TAIL = ["triton::_member_uniform_kernel", "triton::_trading_step_kernel"]
REPLAY_TAIL = ["triton::_replay_add_kernel", "triton::_step_stats_kernel"]
HEAD_COLLECT = {  # act.HEAD_KERNELS on (issue 33 item 2): were 12, 17, 20 and 24 launches at P = 3 (PER's insert 4)
    "eurusd_c51": ["triton::_c51_epsilon_greedy_kernel"] + ENV_TAIL + REPLAY_TAIL,
    "eurusd_iqn": ["triton::_iqn_epsilon_greedy_kernel"] + ENV_TAIL + REPLAY_TAIL,
    "eurusd_branching": ["triton::_branching_epsilon_greedy_kernel"] + ENV_TAIL + REPLAY_TAIL,
    "eurusd_rainbowish": ["triton::_c51_epsilon_greedy_kernel"] + ENV_TAIL + [  # PER's insert: one kernel (was 4)
        "triton::_per_insert_row_kernel"] + REPLAY_TAIL,
}
EPSILON = ["triton::_epsilon_greedy_kernel"]
DUELING = ["aten::add", "aten::mean", "aten::sub"]  # v + a − mean_a a
EXPECTED_Q = ["triton::_c51_expected_q_kernel"]  # Σ_k softmax(logits)_k z_k (Rainbow: after v + a − mean_a a), one kernel
HEAD_LAYERS = {  # act.HEAD_KERNELS off (the default): the head's layers, then the ε-greedy kernel
    # the head's product without its bias (bmm: no copy of the bias into its output, a launch on CUDA), which the
    # expected-Q kernel adds (was baddbmm; softmax, mul, sum before the kernel)
    "eurusd_c51": ["aten::bmm"] + EXPECTED_Q + EPSILON + ENV_TAIL + REPLAY_TAIL,
    # ψ(s) ⊙ φ(τ_k) of the policy fractions one kernel (ops/member_iqn_embedding.py: were the embedding's
    # layer on their constant cos, and ⊙ h; before that mul, cos first), the hidden layer with the mean of
    # its activations over the K fractions in its epilogue (was aten::mean after it), the output layer on
    # the means (the member kernel at 45 columns: was baddbmm on the M·K rows, a bias copy and a GEMM on
    # CUDA, then the mean of Z)
    "eurusd_iqn": ["triton::_iqn_embedding_forward_kernel", "triton::_member_linear_kernel",
                   "triton::_member_linear_kernel"] + EPSILON + ENV_TAIL + REPLAY_TAIL,
    # the branches' and the value's layers one kernel (ops/member_heads.py: were baddbmm × 3 and the value's
    # member_linear), the joint Q (each branch's v + a − mean_a a, then the branches' mean) one kernel: were
    # DUELING × 3 and add, add, div
    "eurusd_branching": ["triton::_member_heads_forward_kernel", "triton::_branching_joint_q_kernel"]
    + EPSILON + ENV_TAIL + REPLAY_TAIL,
    # the value stream through the member kernel, its bias in the epilogue (a split-K pair of bmm at P = 1 on
    # CUDA), then the advantages' bmm
    "eurusd_rainbowish": ["triton::_member_linear_kernel", "aten::bmm"] + EXPECTED_Q + EPSILON + ENV_TAIL + [  # was + DUELING + 3
        "triton::_per_insert_row_kernel"] + REPLAY_TAIL,
}


@pytest.mark.parametrize("fused", [False, True], ids=["layers", "head_kernels"])
@pytest.mark.parametrize("name", list(HEAD_COLLECT))
def test_collect_step_of_a_distributional_or_branching_head(name, fused, monkeypatch):
    """A C51 (plain or dueling, with PER), IQN or branching population's collect step: the draws,
    the encoder's layers, then the head's layers and the ε-greedy kernel (the default,
    act.HEAD_KERNELS off: faster on the H200) or one kernel for the head and the selection, then
    the env and the replay, for 2 and 3 members (the list is exact: a launch added back fails here;
    a population of one differs on the CPU alone, its encoder's layers running as a batch of two
    there, MemberQNetwork.layer)."""
    from foxdqn.population.step import collect_step
    from bench.cpu_kernels import launches, small_overrides
    from bench.harness import make_population

    monkeypatch.setattr(act_mod, "HEAD_KERNELS", fused)
    want = ["triton::_member_uniform_kernel"] + ENCODER + (HEAD_COLLECT if fused else HEAD_LAYERS)[name]
    for members in (2, 3):
        if (name, members) in SHARED and not fused:  # the same population's collect step as below (step_launches)
            assert cached_step_launches(name, members)["collect"] == want, (name, members)
            continue
        s = make_population([f"+experiment={name}", *small_overrides(name), *ATOMS.get(name, ())], members, "cpu")
        assert launches(lambda: collect_step(s)) == want, (name, members)


@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_distributional_heads_are_not_fused_for_acting(head):
    """A C51 or IQN member network's Q is not its layers' output: acting_chain_args and
    q_forward_args are None, so act() takes the head's layers (or its own fused op), not the
    member chain's or q_forward's."""
    s = build_population(configs([*CARTPOLE, f"head={head}"], [["seed=0"], ["seed=1"]]), None, torch.device("cpu"))
    obs = torch.randn(2, 8, 4)
    with torch.no_grad(), B.cpu_kernels():
        assert s.online.acting_chain_args(obs) is None and s.online.q_forward_args(obs) is None


@pytest.mark.parametrize("dueling", [False, True], ids=["q", "duel"])
def test_c51_forward_takes_the_expected_q_op_without_gradient(dueling, monkeypatch):
    """MemberC51Network's forward: inside cpu_kernels without gradient the op (the Q of its own
    logits to float rounding); outside cpu_kernels, or with a gradient, its torch ops."""
    from foxdqn.population import distributional as dist

    head = ["head=c51"] + (["head.dueling=true"] if dueling else [])
    s = build_population(configs([*CARTPOLE, *head], [["seed=0"], ["seed=1"]]), None, torch.device("cpu"))
    net = s.online
    calls = []
    real = dist.c51_expected_q
    monkeypatch.setattr(dist, "c51_expected_q", lambda *a, **k: calls.append(1) or real(*a, **k))
    obs = torch.randn(2, 9, 4, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = net.expected_q(net.logits(obs))
        assert torch.equal(net(obs), want) and not calls  # outside cpu_kernels: the torch ops
        with B.cpu_kernels():
            got = net(obs)
    assert calls == [1]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)
    with B.cpu_kernels():
        net(obs)  # grad mode on: the torch ops (the parameters need a gradient)
    assert calls == [1]


#: issue 33 item 2: a population's update at P = 3 (small nets), at most this many launches; were
#: c51 54, rainbowish 109 and controls 242 with the C51 loss's ops unfused (ops/c51_loss.py: 20
#: forward and 4 backward launches, and Rainbow's dueling combine 3 + 5), PER's sampled slots turned into ring rows by 18 small ops (ops/per_rows.py)
#: and the slots of its update recomputed (4), accumulation's micro-batches copied per field (26)
#: (the loss's sum and its backward's ones_like gone from all: 2 launches, 4 with controls' 2 micro-batches);
#: eurusd_cql 46 with CQL(H)'s logsumexp, gather and means and their backward as 19 torch ops (31 with
#: ops/cql_loss.py's kernel, then none: the term is inside dqn_td_loss's kernel, the update eurusd_dqn's); iql 64 (at P = 2) with IQL's loss arithmetic unfused (ops/iql_loss.py: two
#: gathers, 15 forward and 13 backward ops and the gather's backward became one kernel and its backward's two
#: multiplies)
#: and a population's Linear layers as ops/member_linear.py (the bias and ReLU in the GEMM's epilogue, the ReLU's backward
#: and bias sum one kernel) where they were baddbmm + relu: were c51 28, rainbowish 50, controls 204, cql 26, iql 34
#: (iql 32 with PER's |td| an abs after the loss's kernel, which writes it now; 31 with 14 parameter
#: tensors in two launches each of grad_norm, adam_step and target_lerp: tensor_list.MAX_SLOTS was 8)
#: branching 139 with BDQ's dueling aggregation per branch, factored actions, gathers, argmaxes, the
#: mean target, Huber terms and the joint Q as ~60 torch ops and ~35 in backward (ops/branching_loss.py),
#: 41 with the online rows of s and s' in two forwards (one of the replay's stacked pair now)
#: rainbowish 46 and controls 196 with PER's size and β computed by eight torch ops before each draw
#: (ops/per_schedule.py)
#: iqn 63 with its loss's gathers, argmax, target, two loss kernels, weighted mean and backward as 12
#: launches (ops/iqn_loss.py) and the policy fractions' cos(π i τ) computed per call (a buffer now)
#: controls 189 with its 4 micro-batches as 4 passes (optim.accumulate_one_pass), 104 with the pruning
#: masks' schedule (25 launches) and argsort-scatter (19 a matrix) as torch ops (ops/prune_masks.py) and
#: 48 with the regime weights as 11 (ops/regime_weight.py)
#: c51 24, rainbowish 39, iql 29, iqn 49 with the online network's s and s' rows (IQL: V's) in two passes
#: (one launch per layer for both now: ops/member_linear.py's pair, the MLP chain's split for IQL's V);
#: iqn 48 with the policy fractions' embedding computed for each of its two online policy-Q passes (the
#: monitors' Q of s, the selection's of s'), 47 with those passes apart (one pass over both rows now);
#: controls 38 with the pruning masks' step one launch a matrix (one for all of them now)
#: controls 36, cql 24, iql 28, branching 36, iqn 45 with the loss's backward multiplying its saved
#: gradient by the population's seed of ones (IQL: both gradients)
#: branching 35 with its head's branches and value as layers (3 baddbmm and a member_linear per forward, 15
#: backward launches; one kernel forward and two backward now: ops/member_heads.py)
#: iqn 44 with ψ(s) ⊙ φ(τ) as torch ops and the embedding's layer in each of its three passes (mul, cos,
#: member_linear, mul; the policy's member_linear, mul) and their backward as five launches (one kernel
#: forward and three backward now: ops/member_iqn_embedding.py); 35 with a copy of the Double DQN selection's
#: s' rows (a slice of the policy pass over s and s': ops/iqn_loss.py reads its strides now)
#: c51 23, rainbowish 38 with the C51 loss's importance-weighted mean per member as torch ops (mul,
#: mean, and the backward's div and mul; inside ops/c51_loss.py's two kernels now); rainbowish 34 with the
#: dueling head's two x-gradients summed by an add (the second GEMM accumulates into the first's now:
#: population/layers.py's member_products); iqn 34 with τ and τ' drawn in two launches (one now:
#: population/objective.py member_taus)
UPDATE_AT_MOST = {"eurusd_c51": 19, "eurusd_rainbowish": 33, "eurusd_controls": 35, "eurusd_cql": 23, "eurusd_iql": 26,
                  "eurusd_branching": 16, "eurusd_iqn": 33}
C51_HEAD = ("eurusd_c51", "eurusd_rainbowish")
PRIORITIZED = ("eurusd_rainbowish", "eurusd_controls")
#: a C51 head's atoms here: 11 (odd, masked in a block of 16) instead of 51; the launches do not depend on
#: them, the interpreter's time does (51 atoms: one row per program, 5-10 times longer)
ATOMS = {"eurusd_c51": ("head.atoms=11",), "eurusd_rainbowish": ("head.atoms=11",)}


#: populations whose steps both the collect test above and the update test below count: step_launches
#: runs once per pytest process for both (it builds the population as the collect test does, with
#: small_overrides and ATOMS, and counts its collect step first)
SHARED = {("eurusd_c51", 3), ("eurusd_rainbowish", 3)}


@functools.lru_cache(maxsize=None)
def cached_step_launches(name: str, members: int) -> dict[str, list[str]]:
    return step_launches(name, members, ATOMS.get(name, ()))


@pytest.mark.parametrize("name", list(UPDATE_AT_MOST))
def test_update_launches_stay_fused(name):
    ops = (cached_step_launches(name, 3) if (name, 3) in SHARED else step_launches(name, 3, ATOMS.get(name, ())))["update"]
    assert len(ops) <= UPDATE_AT_MOST[name], (len(ops), ops)
    # every network here has at most tensor_list.MAX_SLOTS parameter tensors: one launch of each; the
    # target update inside Adam's unless Adam trains IQL's V too or pruning masks come between them
    assert [ops.count(k) for k in UPDATE_TAIL] == [1, 1], Counter(ops)
    assert ops.count(GRAD_NORM) == (name not in CHAIN_NORM), Counter(ops)
    assert ops.count("triton::_target_lerp_kernel") == (name in SEPARATE_TARGET_UPDATE), Counter(ops)
    if name in C51_HEAD:  # its loss is two kernels
        assert ops.count("triton::_c51_loss_fwd_kernel") == ops.count("triton::_c51_loss_bwd_kernel") == 1
        assert not {"aten::log_softmax", "aten::softmax", "aten::argmax", "aten::stack", "aten::zeros",
                    "aten::mul", "aten::mean", "aten::div", "aten::baddbmm"} & set(ops), Counter(ops)
        # the heads' products by bmm (their biases in the loss's kernels); dueling: x's two gradients summed
        # by the second GEMM in place (population/layers.py member_products)
        assert ops.count("aten::baddbmm_") == (name == "eurusd_rainbowish") and "aten::add_" not in ops, Counter(ops)
    if name == "eurusd_cql":  # α · CQL(H) inside the TD loss's kernel: no launch of its own
        assert ops.count("triton::_dqn_td_loss_kernel") == 1 and "triton::_cql_loss_kernel" not in ops
        assert not {"aten::logsumexp", "aten::gather", "aten::mean", "aten::exp", "aten::add"} & set(ops), ops
    if name == "eurusd_iql":  # IQL's L_Q + L_V, td and both gradients: one kernel, no gather or elementwise op
        assert ops.count("triton::_iql_loss_kernel") == 1
        assert not {"aten::gather", "aten::gather_backward", "aten::where", "aten::square", "aten::pow",
                    "aten::mean", "aten::lt", "aten::rsub", "aten::sub", "aten::neg", "aten::abs"} & set(ops), Counter(ops)
    if name == "eurusd_branching":  # the loss from the heads' raw outputs: one kernel, its saved gradient as backward
        assert ops.count("triton::_branching_loss_kernel") == 1
        assert [ops.count(f"triton::_member_heads_{k}_kernel") for k in ("forward", "dx", "dw")] == [2, 1, 1]
        assert not {"aten::baddbmm", "aten::bmm"} & set(ops[:ops.index("triton::_member_heads_dw_kernel")]), ops
        assert not {"aten::gather", "aten::gather_backward", "aten::argmax", "aten::stack", "aten::mean", "aten::where",
                    "aten::div", "aten::sub", "aten::abs", "aten::sgn", "aten::neg"} & set(ops), Counter(ops)
    if name == "eurusd_iqn":  # after the heads: one kernel, its saved gradient as backward
        assert ops.count("triton::_iqn_loss_kernel") == 1 and "triton::_qhl_fwd_kernel" not in ops
        assert not {"aten::gather", "aten::gather_backward", "aten::argmax", "aten::add", "aten::div"} & set(ops)
        assert "aten::cos" not in ops and ops.count("triton::_iqn_embedding_forward_kernel") == 3, Counter(ops)
        assert ops.count("triton::_iqn_embedding_backward_kernel") == 1
        # the rows' draw and one of τ and τ' (was one each: population/objective.py member_taus), read in place
        assert ops.count("triton::_member_uniform_kernel") == 2 and "aten::clone" not in ops, Counter(ops)
        # Z and Z' by bmm, their output bias added in iqn_loss's kernel (no copy of the bias on CUDA); the
        # policy pass's output layer by the member kernel on the hidden layer's means over the fractions
        # (was baddbmm on every fraction's row, then the mean of Z), that mean in the hidden layer's
        # epilogue (was aten::mean), its rows of s and s' read in place by the embedding's kernel (was
        # aten::cat); the output bias's gradient by iqn_loss's kernel and the embedding bias's by the
        # embedding's backward kernel (were aten::sum each)
        assert "aten::baddbmm" not in ops and ops.count("aten::bmm") == 8, Counter(ops)
        assert not {"aten::mean", "aten::cat", "aten::sum"} & set(ops), Counter(ops)
        # the policy pass is the online network's last: the target's forward (τ') runs first (on the CPU; on
        # CUDA on its own stream beside the online forward)
        policy = len(ops) - 1 - ops[::-1].index("triton::_iqn_embedding_forward_kernel")
        assert ops[policy:policy + 3] == ["triton::_iqn_embedding_forward_kernel", "triton::_member_linear_kernel",
                                          "triton::_member_linear_kernel"], ops
    if name in PRIORITIZED:  # slots to rows in one kernel, none for the update's slots; size and β one kernel
        assert ops.count("triton::_per_rows_kernel") == 1 and ops.count("triton::_per_schedule_kernel") == 1
        assert ops[1:3] == ["triton::_per_schedule_kernel", "triton::_per_prefix_kernel"], ops[:4]
        assert not {"aten::floor_divide", "aten::remainder"} & set(ops), ops
    if name == "eurusd_controls":  # one pass of the 4 micro-batches; the masks' step one kernel; regime one
        assert ops.count("triton::_dqn_td_loss_kernel") == 1 and ops.count("triton::_regime_weight_kernel") == 1
        assert ops.count("triton::_prune_masks_kernel") == 1, Counter(ops)
        assert not {"aten::argsort", "aten::scatter_", "aten::where", "aten::index", "aten::cat"} & set(ops), Counter(ops)


#: issue 33: bit flipping with HER, an update at most this many launches at P = 1 and 2; were 56 and 61
#: with the relabelling's index arithmetic, goal swap and reward in ~40 torch ops (and the member
#: batch's reshapes at P > 1), now one kernel (foxdqn/ops/her_relabel.py): 16 at both
HER_UPDATE_AT_MOST = 40


@pytest.mark.parametrize("members", [1, 2])
def test_her_update_relabels_in_one_kernel(members):
    """bitflip_her's update: the draws, the gather, the members' relabel uniforms and one relabelling
    kernel, whose obs and next_obs stay the halves of a stacked pair (no concatenation before the
    forwards), then the loss of cartpole_cleanrl's member MLP chain and the update's tail."""
    ops = step_launches("bitflip_her", members)["update"]
    assert len(ops) <= HER_UPDATE_AT_MOST, (len(ops), ops)
    head = UPDATE_HEAD + ["triton::_member_uniform_kernel", "triton::_her_relabel_kernel"]
    tail = update_tail("bitflip_her")
    assert ops[:len(head)] == head and ops[-len(tail):] == tail, ops
    assert ops[len(head):-len(tail)] == CARTPOLE_LOSS, ops
    assert "aten::item" not in ops and "aten::_local_scalar_dense" not in ops  # no host read


@pytest.mark.parametrize("layers", [1, 2])
def test_attention_encoder_without_gradient_is_one_kernel_per_block_and_one_pooling(layers):
    """An attention population's collect step and its update's target forward (no gradient): the
    encoder is one kernel per block and one for the final layer norm, pooling and output Linear
    (ops/member_attention_encoder.py): no layer norm, attention, GELU, add, mean or cat of torch's,
    and the whole collect step within issue 33's 12 launches. The update's online forward runs each
    block as one kernel too, and its backward as two (ops/member_attention_block.py)."""
    from foxdqn.population.step import collect_step, update_step
    from bench.cpu_kernels import launches, small_overrides
    from bench.harness import make_population

    # width 32 of 2 heads (the op's smallest head of 16): the interpreter's time grows with the width
    s = make_population(["+experiment=eurusd_attention", *small_overrides("eurusd_attention"), f"model.layers={layers}",
                         "model.width=32", "model.heads=2"], 2, "cpu")
    ops = launches(lambda: collect_step(s))
    encoder = ["triton::_attention_block_kernel"] * layers + ["triton::_attention_pool_kernel"]
    start = ops.index(encoder[0])
    assert ops[start:start + len(encoder)] == encoder and len(ops) <= 12, ops
    assert not {"aten::layer_norm", "aten::native_layer_norm", "aten::scaled_dot_product_attention", "aten::gelu",
                "aten::mean", "aten::cat", "triton::_member_layer_norm_kernel"} & set(ops), Counter(ops)
    if layers == 1:  # the update (the interpreted update's time grows with the blocks): the target forward's
        # encoder, and the online forward's block with its two backward kernels (ops/member_attention_block.py)
        update = launches(lambda: update_step(s))
        assert update.count("triton::_attention_pool_kernel") == 1, Counter(update)
        assert update.count("triton::_attention_block_kernel") == 2, Counter(update)
        assert update.count("triton::_attention_block_backward_kernel") == 1, Counter(update)
        assert update.count("triton::_attention_block_weights_kernel") == 1, Counter(update)
        assert not {"aten::scaled_dot_product_attention", "aten::gelu", "aten::native_layer_norm"} & set(update), \
            Counter(update)
        # every gradient in the parameters' layout: a strided one is copied by autograd's accumulation
        assert "aten::copy_" not in update, Counter(update)
