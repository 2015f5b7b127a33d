"""CartPole section: env steps/s and wall-clock time to a mean greedy evaluation return ≥ 475.

Rows: foxdqn's ``cartpole_dqn`` (rl-zoo's settings reshaped for a GPU: 16 envs × 16 steps and 32
updates of batch 256 per iteration), ``cartpole_cleanrl`` (CleanRL's DQN settings), ``cartpole_zoo``
(rl-baselines3-zoo's DQN CartPole-v1 hyperparameters translated to foxdqn,
conf/experiment/cartpole_zoo.yaml) and ``cartpole_zoo_x16`` (cartpole_zoo with its 256 env steps per
iteration taken as 16 steps of 16 envs), all on the device CartPole, graph on and off on CUDA, eager
only on CPU; and, when ``stable_baselines3`` imports (the ``bench`` extra), Stable-Baselines3's DQN
with rl-zoo's published CartPole-v1 hyperparameters (``hyperparams/dqn.yml``), measured in the same
run. ``cartpole_zoo`` against ``sb3_dqn_zoo`` is the same algorithm with the same hyperparameters, so
their time to 475 compares the frameworks; the other rows compare settings as much as frameworks.

Every run is evaluated on 20 greedy episodes (first episode of each of 20 envs) every ``every``
env steps of its :class:`RowSpec` (2560 for all but cartpole_cleanrl's 10k); the clock stops during
evaluations, so ``time_to_475_s`` is training wall time. A run stops when it reaches 475 or its
env-step cap. The ε schedule of every run follows its experiment's budget (``schedule_steps``), not
the cap, so a cap never changes a trajectory.

Seeds (``python -m bench.run --sections cartpole --seeds S``): every graph row (CUDA) and the SB3
row run seeds 0..S-1; on CUDA the eager row is ``cartpole_dqn``'s seed 0, capped at the env steps its
graph run needed (the same trajectory; graph on/off). The time to 475 of one seed is one draw of
a distribution several-fold wide in both frameworks, so :func:`summary` compares medians over
seeds. ``--only`` picks rows by name (e.g. ``--only cartpole_dqn,sb3_dqn_zoo``).

Every foxdqn time includes its graph warm-up and capture, and on the first seed of a process the
Triton kernels' compilation; SB3's includes nothing comparable.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from bench.harness import iteration, make_state
from foxdqn.population.evaluate import member_episodes

THRESHOLD = 475.0
EVAL_EPISODES = 20

# rl-baselines3-zoo hyperparams/dqn.yml, CartPole-v1 (n_timesteps 5e4, one env)
SB3_ZOO_CARTPOLE = dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
                        target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
                        exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]))
SB3_ZOO_TIMESTEPS = 50_000
SB3_TORCH_THREADS = 1


@dataclass(frozen=True)
class RowSpec:
    """Budget of one bench row on one device, in env steps (all envs)."""

    schedule_steps: int  # agent.total_env_steps: the ε schedule's length (SB3: learn's ε fraction is rescaled to it)
    cap: int  # the run stops here if it has not reached 475
    every: int  # evaluate every this many env steps


# bench row name -> (experiment, extra overrides)
VARIANTS = {
    "cartpole_dqn": ("cartpole_dqn", ()),
    "cartpole_cleanrl": ("cartpole_cleanrl", ()),
    "cartpole_zoo": ("cartpole_zoo", ()),
    "cartpole_zoo_x16": ("cartpole_zoo", ("env.num_envs=16", "agent.steps_per_iter=16")),
}


def spec(name: str, device: str) -> RowSpec:
    """Budgets of the :data:`VARIANTS` rows and ``sb3_dqn_zoo`` on ``device``."""
    cuda = device == "cuda"
    if name == "cartpole_cleanrl":  # CleanRL's 500k schedule on CUDA; a short rate measurement on CPU
        return RowSpec(500_000, 500_000, 10_000) if cuda else RowSpec(20_000, 20_000, 5_000)
    if name == "cartpole_dqn":  # its own 100k schedule (ε over the first 8,000 env steps, as rl-zoo's)
        return RowSpec(100_000, 100_000 if cuda else SB3_ZOO_TIMESTEPS, 2560)
    if name in ("cartpole_zoo", "cartpole_zoo_x16", "sb3_dqn_zoo"):  # rl-zoo's n_timesteps schedule; 10 rollouts of 256
        return RowSpec(SB3_ZOO_TIMESTEPS, 2 * SB3_ZOO_TIMESTEPS if cuda else SB3_ZOO_TIMESTEPS, 2560)
    raise ValueError(f"no cartpole bench row {name!r}")


def _foxdqn_row(device: str, graph: bool, name: str = "cartpole_dqn", cap: int | None = None, seed: int = 0) -> dict:
    """One run of the :data:`VARIANTS` row ``name`` (``seed``) until the mean greedy return reaches
    475 or ``cap`` env steps (default: the row's :func:`spec` cap)."""
    sp = spec(name, device)
    cap, every = cap or sp.cap, sp.every
    experiment, extra = VARIANTS[name]
    # the schedule (ε decay) follows schedule_steps in every run, so a shorter cap does not change the trajectory
    s = make_state([f"+experiment={experiment}", f"agent.total_env_steps={sp.schedule_steps}", f"seed={seed}", *extra],
                   device, fill=False)
    cfg, a = s.cfg, s.cfg.agent
    per_iter = cfg.env.num_envs * a.steps_per_iter
    warm = math.ceil(a.learning_starts / per_iter)
    collect, full = iteration(s, graph, updates=0), iteration(s, graph)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    train_s, reached_at, last = 0.0, None, float("nan")
    t = time.perf_counter()
    for it in range(math.ceil(cap / per_iter)):
        (collect if it < warm else full)()
        steps = (it + 1) * per_iter
        if steps % every < per_iter:
            sync()
            train_s += time.perf_counter() - t
            last = member_episodes(s, EVAL_EPISODES, seed_offset=1)[0]["mean_return"]
            if last >= THRESHOLD:
                reached_at = steps
                break
            t = time.perf_counter()
    else:
        sync()
        train_s += time.perf_counter() - t
    steps = reached_at or math.ceil(cap / per_iter) * per_iter
    return {"section": "cartpole", "features": name, "size": f"envs{cfg.env.num_envs}", "seed": seed,
            "provider": "graph" if graph else "eager", "device": device, "env_steps_per_s": steps / train_s,
            "reached_475": reached_at is not None, "env_steps_to_475": reached_at,
            "time_to_475_s": train_s if reached_at else None, "last_eval_return": last, "train_s": train_s}


def _sb3_eval(model, episodes: int, seed: int) -> float:
    import gymnasium as gym

    env = gym.make_vec("CartPole-v1", episodes, vectorization_mode="sync")
    obs, _ = env.reset(seed=seed)
    ret, done_ret = np.zeros(episodes), np.full(episodes, np.nan)
    while np.isnan(done_ret).any():
        action, _ = model.predict(obs, deterministic=True)
        obs, r, term, trunc, _ = env.step(action)
        ret += r
        ended = (term | trunc) & np.isnan(done_ret)
        done_ret[ended] = ret[ended]
        ret[term | trunc] = 0.0
    env.close()
    return float(done_ret.mean())


def _sb3_row(device: str, seed: int = 0) -> dict:
    import stable_baselines3
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback

    sp = spec("sb3_dqn_zoo", device)
    cap, every = sp.cap, sp.every
    # SB3's ε decays over exploration_fraction × learn()'s total_timesteps: rescaled so that it decays over
    # rl-zoo's 0.16 × 50k env steps whatever the cap
    hyper = {**SB3_ZOO_CARTPOLE,
             "exploration_fraction": SB3_ZOO_CARTPOLE["exploration_fraction"] * sp.schedule_steps / cap}
    sb3_device = "cpu"  # SB3 recommends the CPU for MlpPolicy DQN
    # torch threads as foxdqn's CPU runs (cpu_threads: 1), set here so the row does not depend on which rows ran first
    torch.set_num_threads(SB3_TORCH_THREADS)

    class EvalEvery(BaseCallback):
        def __init__(self):
            super().__init__()
            self.train_s, self.reached_at, self.last, self._t = 0.0, None, float("nan"), None

        def _on_training_start(self):
            self._t = time.perf_counter()

        def _on_step(self) -> bool:
            if self.num_timesteps % every:
                return True
            self.train_s += time.perf_counter() - self._t
            self.last = _sb3_eval(self.model, EVAL_EPISODES, seed=1)
            self._t = time.perf_counter()
            if self.last >= THRESHOLD:
                self.reached_at = self.num_timesteps
                return False
            return True

        def _on_training_end(self):
            if self.reached_at is None:
                self.train_s += time.perf_counter() - self._t

    model = DQN("MlpPolicy", "CartPole-v1", device=sb3_device, seed=seed, verbose=0, **hyper)
    cb = EvalEvery()
    model.learn(total_timesteps=cap, callback=cb)
    steps = cb.reached_at or model.num_timesteps
    return {"section": "cartpole", "features": "sb3_dqn_zoo", "size": "envs1", "seed": seed, "provider": "sb3",
            "device": sb3_device,
            "sb3": stable_baselines3.__version__, "torch_threads": SB3_TORCH_THREADS,
            "env_steps_per_s": steps / max(cb.train_s, 1e-9),
            "reached_475": cb.reached_at is not None, "env_steps_to_475": cb.reached_at,
            "time_to_475_s": cb.train_s if cb.reached_at else None, "last_eval_return": cb.last,
            "train_s": cb.train_s, "note": f"rl-zoo n_timesteps={SB3_ZOO_TIMESTEPS} (ε schedule); capped here at {cap}"}


def _fox_rows(device: str, graph: bool, name: str, seeds: int, cap: int | None = None):
    """Rows of ``name``, seeds 0..seeds-1, graph on or off, each stopped at ``cap`` env steps if given."""
    for seed in range(seeds):
        row = _foxdqn_row(device, graph, name, cap=cap, seed=seed)
        print(row, flush=True)
        yield row


def _sb3_rows(device: str, seeds: int):
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        yield {"section": "cartpole", "features": "sb3_dqn_zoo", "provider": "sb3",
               "note": "stable-baselines3 not installed (pip install 'foxdqn[bench]'); skipped"}
        return
    for seed in range(seeds):
        row = _sb3_row(device, seed)
        print(row, flush=True)
        yield row


ROWS = ("cartpole_dqn", "sb3_dqn_zoo", "cartpole_cleanrl", "cartpole_zoo", "cartpole_zoo_x16")


def rows(device: str = "cuda", seeds: int = 1, only: tuple[str, ...] | None = None):
    """Yields the rows one at a time (bench.run writes the CSV after each, so a run stopped by a time
    limit keeps the rows it finished). ``only``: names from :data:`ROWS` (default all).

    CUDA: cartpole_dqn's graph rows (seeds 0..seeds-1), the SB3 rows (same seeds), cartpole_dqn's eager
    row (seed 0, capped at the env steps seed 0's graph run needed: graph and eager compute the same
    trajectory, tests/step/test_graph_gpu.py), then the graph rows of cartpole_cleanrl, cartpole_zoo and
    cartpole_zoo_x16. CPU: the eager rows of cartpole_dqn, cartpole_cleanrl and cartpole_zoo, then SB3,
    every seed.

    Raises:
        ValueError: a name in ``only`` that is not in :data:`ROWS`.
    """
    only = tuple(only or ROWS)
    unknown = sorted(set(only) - set(ROWS))
    if unknown:
        raise ValueError(f"--only: unknown cartpole rows {unknown}; allowed: {', '.join(ROWS)}")
    if device != "cuda":
        for name in ("cartpole_dqn", "cartpole_cleanrl", "cartpole_zoo"):
            if name in only:
                yield from _fox_rows(device, False, name, seeds)
        if "sb3_dqn_zoo" in only:
            yield from _sb3_rows(device, seeds)
        return
    dqn = []
    if "cartpole_dqn" in only:
        for row in _fox_rows(device, True, "cartpole_dqn", seeds):
            dqn.append(row)
            yield row
    if "sb3_dqn_zoo" in only:
        yield from _sb3_rows(device, seeds)
    if dqn:
        yield from _fox_rows(device, False, "cartpole_dqn", 1, cap=dqn[0]["env_steps_to_475"])
    for name in ("cartpole_cleanrl", "cartpole_zoo", "cartpole_zoo_x16"):
        if name in only:
            yield from _fox_rows(device, True, name, seeds)


def summary(cp: pd.DataFrame) -> pd.DataFrame:
    """Per (features, provider): seeds run, seeds that reached 475, the median over seeds of the env
    steps and training seconds to 475 (a seed that did not reach it counts as +inf, so the median is
    empty unless more than half reached it) and of env steps/s; and, when SB3's median exists, SB3's
    median time / this row's median time (> 1: this row gets there sooner)."""
    cp = cp.copy()
    for col in ("env_steps_to_475", "time_to_475_s", "env_steps_per_s"):
        cp[col] = pd.to_numeric(cp[col], errors="coerce") if col in cp else float("nan")
    cp["reached"] = cp["time_to_475_s"].notna()
    for col in ("env_steps_to_475", "time_to_475_s"):
        cp[col] = cp[col].where(cp["reached"], math.inf)
    g = cp.groupby(["features", "provider"], sort=False)
    out = pd.DataFrame({
        "seeds": g.size(),
        "reached_475": g["reached"].sum().astype(int),
        "median env_steps_to_475": g["env_steps_to_475"].median(),
        "median time_to_475_s": g["time_to_475_s"].median(),
        "median env_steps_per_s": g["env_steps_per_s"].median(),
    }).reset_index().replace(math.inf, float("nan"))
    sb3 = out[(out.provider == "sb3") & out["median time_to_475_s"].notna()]
    if len(sb3):
        out["SB3 median time / median time"] = sb3["median time_to_475_s"].iloc[0] / out["median time_to_475_s"]
    return out
