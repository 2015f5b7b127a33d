r"""The JAX peer of ``cartpole_cleanrl``: PureJaxRL's DQN with CleanRL's CartPole settings, P seeds
vmapped in one ``jit``.

Our own implementation of the published algorithm (PureJaxRL's ``purejaxrl/dqn.py``, itself
CleanRL's ``dqn_jax.py`` made pure JAX), on gymnax's ``CartPole-v1`` with a flashbax flat buffer,
as PureJaxRL does:

* every iteration steps ``num_envs`` envs once with ε-greedy actions (ε linear from ``eps_start``
  to ``eps_end`` over ``eps_anneal_steps`` env steps, then flat) and adds the ``num_envs``
  transitions ``(obs, action, reward, done)`` to the buffer; the buffer pairs each with the next
  item of the same env for its next observation;
* once more than ``learning_starts`` env steps have run, every ``train_interval`` env steps:
  one Adam step (optax defaults: ε = 1e-8, no gradient clipping) on the mean squared error of
  ``Q(s, a)`` against ``r + γ (1 − done) max_a' Q_target(s', a')`` over ``batch_size`` uniform
  samples;
* every ``target_period`` env steps the target network is a copy of the online one (τ = 1);
* ``done`` is gymnax's ``terminated or truncated``: like PureJaxRL (whose gymnax counted the
  time limit as terminal), a truncated episode is not bootstrapped.

What differs from foxdqn's ``cartpole_cleanrl`` besides the framework: foxdqn's Adam has ε = 1e-5 and
clips the gradient norm at 10, and it bootstraps through the 500-step time limit. The target is the
same max over the target network (a config with Double DQN's, ``head.double=true``, is refused).
PureJaxRL's rng slip (its ``train`` overwrites the seed key with ``PRNGKey(0)``, so every seed started
from one network) is not copied: each seed draws its own network, env and exploration keys.

Evaluation: ``eval_episodes`` greedy episodes per seed (100, foxdqn's ``eval.episodes``), one in
each of ``eval_episodes`` envs, each played to its end or the 500-step limit; the return of each
seed is their mean.

Timing: the training and the evaluation are compiled ahead of time (``jit(...).lower().compile()``),
so compile and run are timed apart. ``env_steps_per_s`` counts compile in (like foxdqn's training
time, which counts its warm-up and graph capture), ``env_steps_per_s_run`` leaves it out.

Run: ``python -m bench.peers.jax_dqn_cartpole --seeds 16 [--first-seed K] [--env-steps N] [--settings JSON]
[--out FILE]``
(needs ``pip install -e '.[peers]'``). ``bench/population_bench.py`` runs it beside the
``cartpole_cleanrl`` population rows, with the settings read from the composed foxdqn config
(:func:`settings_from_config`). Importing this module needs none of the JAX packages.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Settings:
    """The algorithm's settings; the defaults are CleanRL's CartPole DQN and foxdqn's ``cartpole_cleanrl``
    (tests/test_bench_population_peer.py checks them against the composed config). Counts are env steps
    of one seed, all its envs together."""

    total_env_steps: int = 500_000
    num_envs: int = 10
    buffer_size: int = 10_000  # transitions, all envs together (flashbax: buffer_size // num_envs per env)
    batch_size: int = 128
    lr: float = 2.5e-4
    gamma: float = 0.99
    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_anneal_steps: int = 250_000
    target_period: int = 500
    learning_starts: int = 10_000
    train_interval: int = 10
    hidden: tuple[int, ...] = (120, 84)
    eval_episodes: int = 100

    @property
    def iterations(self) -> int:
        """Iterations of ``num_envs`` env steps each (the last partial one is not run)."""
        return self.total_env_steps // self.num_envs

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Settings":
        values = json.loads(text)
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"settings: unknown keys {unknown}")
        if "hidden" in values:
            values["hidden"] = tuple(int(h) for h in values["hidden"])
        return cls(**values)


def settings_from_config(cfg) -> Settings:
    """The peer's settings of a composed foxdqn config (``foxdqn.config.compose.load_config``; debug caps
    applied), so that the peer trains what the foxdqn rows train.

    Raises:
        ValueError: the config asks for something the peer does not do (names each setting).
    """
    a = cfg.agent
    wanted = {"env.name": (cfg.env.name, "cartpole"), "head.name": (str(cfg.head.name), "q"),
              "head.dueling": (cfg.head.dueling, False), "head.double": (cfg.head.double, False),
              "replay.name": (str(cfg.replay.name), "uniform"),
              "replay.n_step": (cfg.replay.n_step, 1), "replay.her": (cfg.replay.her, False),
              "agent.steps_per_iter": (a.steps_per_iter, 1), "agent.updates_per_iter": (a.updates_per_iter, 1),
              "target.update": (str(cfg.target.update), "hard"), "loss.reward_scale": (cfg.loss.reward_scale, 1.0),
              "model.encoder": (str(cfg.model.encoder), "mlp"), "model.activation": (str(cfg.model.activation), "relu"),
              "objective.cql_alpha": (cfg.objective.cql_alpha, 0.0), "objective.iql": (cfg.objective.iql, False)}
    bad = [f"{key}={have!r} (the peer has {want!r})" for key, (have, want) in wanted.items()
           if _plain(have) != want]
    if bad:
        raise ValueError("the JAX peer cannot train this config: " + ", ".join(bad))
    per_update = cfg.env.num_envs  # env steps per update: steps_per_iter = updates_per_iter = 1
    return Settings(
        total_env_steps=int(a.total_env_steps), num_envs=int(cfg.env.num_envs), buffer_size=int(cfg.replay.capacity),
        batch_size=int(a.batch_size), lr=float(cfg.optim.lr), gamma=float(a.gamma),
        eps_start=float(cfg.explore.eps_start), eps_end=float(cfg.explore.eps_end),
        eps_anneal_steps=int(round(cfg.explore.eps_decay_fraction * a.total_env_steps)),
        target_period=int(cfg.target.period) * per_update, learning_starts=int(a.learning_starts),
        train_interval=per_update, hidden=tuple(int(h) for h in cfg.model.hidden),
        eval_episodes=int(cfg.eval.episodes))


def _plain(value):
    """An enum's value (foxdqn's config enums print as ``Name.value``), else ``value``."""
    return getattr(value, "value", value)


# ------------------------------------------------------------------------------------------ the algorithm


def _build(s: Settings):
    """The jittable ``train(key) -> (params, curve_sum, curve_count)`` and ``evaluate(params, key) ->
    returns[eval_episodes]`` of one seed (vmap them over seeds)."""
    import flashbax
    import flax.linen as nn
    import gymnax
    import jax
    import jax.numpy as jnp
    import optax

    env, env_params = gymnax.make("CartPole-v1")
    actions = env.num_actions
    curve_points = 20  # mean return of the episodes that finished in each twentieth of training

    class QNetwork(nn.Module):
        hidden: tuple[int, ...]
        actions: int

        @nn.compact
        def __call__(self, x):
            for width in self.hidden:
                x = nn.relu(nn.Dense(width)(x))
            return nn.Dense(self.actions)(x)

    net = QNetwork(s.hidden, actions)
    tx = optax.adam(s.lr)
    buffer = flashbax.make_flat_buffer(max_length=s.buffer_size, min_length=s.batch_size,
                                       sample_batch_size=s.batch_size, add_sequences=False,
                                       add_batch_size=s.num_envs)
    reset = jax.vmap(env.reset, in_axes=(0, None))
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    obs_size = env.observation_space(env_params).shape[0]

    def epsilon(t):
        slope = (s.eps_end - s.eps_start) / s.eps_anneal_steps
        return jnp.maximum(s.eps_start + slope * t, s.eps_end)

    def learn(params, target, opt_state, batch):
        next_q = net.apply(target, batch.second["obs"]).max(axis=-1)
        y = batch.first["reward"] + s.gamma * (1.0 - batch.first["done"]) * next_q

        def loss(p):
            q = net.apply(p, batch.first["obs"])
            q_a = jnp.take_along_axis(q, batch.first["action"][:, None], axis=-1)[:, 0]
            return jnp.mean((q_a - y) ** 2)

        grads = jax.grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def train(key):
        k_env, k_net, k_loop = jax.random.split(key, 3)
        obs, env_state = reset(jax.random.split(k_env, s.num_envs), env_params)
        params = net.init(k_net, jnp.zeros(obs_size))
        item = {"obs": jnp.zeros(obs_size), "action": jnp.int32(0), "reward": jnp.float32(0.0),
                "done": jnp.float32(0.0)}
        carry = dict(params=params, target=params, opt_state=tx.init(params), buffer=buffer.init(item),
                     env_state=env_state, obs=obs, t=jnp.int32(0), it=jnp.int32(0), key=k_loop,
                     ep_return=jnp.zeros(s.num_envs), curve_sum=jnp.zeros(curve_points),
                     curve_count=jnp.zeros(curve_points))

        def iteration(c, _):
            key, k_explore, k_pick, k_step, k_sample = jax.random.split(c["key"], 5)
            greedy = net.apply(c["params"], c["obs"]).argmax(axis=-1)
            explore = jax.random.uniform(k_explore, (s.num_envs,)) < epsilon(c["t"])
            action = jnp.where(explore, jax.random.randint(k_pick, (s.num_envs,), 0, actions), greedy)
            obs, env_state, reward, terminated, truncated, _ = step(
                jax.random.split(k_step, s.num_envs), c["env_state"], action, env_params)
            done = jnp.logical_or(terminated, truncated).astype(jnp.float32)
            buf = buffer.add(c["buffer"], {"obs": c["obs"], "action": action.astype(jnp.int32),
                                           "reward": reward.astype(jnp.float32), "done": done})
            t = c["t"] + s.num_envs
            learn_now = buffer.can_sample(buf) & (t > s.learning_starts) & (t % s.train_interval == 0)
            params, opt_state = jax.lax.cond(
                learn_now,
                lambda: learn(c["params"], c["target"], c["opt_state"], buffer.sample(buf, k_sample).experience),
                lambda: (c["params"], c["opt_state"]))
            copy = t % s.target_period == 0
            target = jax.tree_util.tree_map(lambda p, q: jnp.where(copy, p, q), params, c["target"])
            ep_return = c["ep_return"] + reward
            point = c["it"] * curve_points // s.iterations
            c = dict(params=params, target=target, opt_state=opt_state, buffer=buf, env_state=env_state, obs=obs,
                     t=t, it=c["it"] + 1, key=key, ep_return=ep_return * (1.0 - done),
                     curve_sum=c["curve_sum"].at[point].add((ep_return * done).sum()),
                     curve_count=c["curve_count"].at[point].add(done.sum()))
            return c, None

        c, _ = jax.lax.scan(iteration, carry, None, s.iterations)
        return c["params"], c["curve_sum"], c["curve_count"]

    def evaluate(params, key):
        k_reset, k_loop = jax.random.split(key)
        obs, env_state = reset(jax.random.split(k_reset, s.eval_episodes), env_params)

        def one_step(c, _):
            obs, env_state, key, ret, running = c
            key, k_step = jax.random.split(key)
            action = net.apply(params, obs).argmax(axis=-1)
            obs, env_state, reward, terminated, truncated, _ = step(
                jax.random.split(k_step, s.eval_episodes), env_state, action, env_params)
            ret = ret + reward * running
            running = running * (1.0 - jnp.logical_or(terminated, truncated))
            return (obs, env_state, key, ret, running), None

        start = (obs, env_state, k_loop, jnp.zeros(s.eval_episodes), jnp.ones(s.eval_episodes))
        (_, _, _, ret, _), _ = jax.lax.scan(one_step, start, None, env_params.max_steps_in_episode)
        return ret

    return train, evaluate


def check_seeds(seeds: int, first_seed: int) -> None:
    """The seed range's rule, for :func:`train` and the CLI (which checks it before any import).

    Raises:
        ValueError: ``seeds`` < 1 or ``first_seed`` < 0 (naming the argument).
    """
    if seeds < 1:
        raise ValueError(f"seeds: must be >= 1, got {seeds}")
    if first_seed < 0:
        raise ValueError(f"first_seed: must be >= 0, got {first_seed}")


def train(seeds: int, settings: Settings = Settings(), first_seed: int = 0) -> dict:
    """Train seeds ``first_seed .. first_seed + seeds - 1`` as one vmapped, jitted program, then
    evaluate each greedily.

    Returns a JSON-ready dict: ``returns`` (each seed's mean greedy return over
    ``settings.eval_episodes`` episodes), ``return_mean/min/max`` over seeds, ``curve`` (mean
    training-episode return in each twentieth of training, over seeds), seconds ``compile_s``
    (``compile_train_s`` + ``compile_eval_s``), ``run_s`` (training, compiled), ``eval_s``,
    ``train_s`` (``compile_train_s + run_s``), ``total_s`` (this call), env steps
    ``env_steps`` (all seeds), ``env_steps_per_s`` (over ``train_s``), ``env_steps_per_s_run``
    (over ``run_s``), ``first_seed``, and the device, the versions and the settings.

    Raises:
        ValueError: ``seeds`` < 1 or ``first_seed`` < 0.
    """
    check_seeds(seeds, first_seed)
    start = time.perf_counter()
    import jax
    import numpy as np

    train_one, evaluate_one = _build(settings)
    keys = jax.vmap(jax.random.PRNGKey)(np.arange(first_seed, first_seed + seeds))
    eval_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)
    t0 = time.perf_counter()
    train_all = jax.jit(jax.vmap(train_one)).lower(keys).compile()
    t1 = time.perf_counter()
    params, curve_sum, curve_count = jax.block_until_ready(train_all(keys))
    t2 = time.perf_counter()
    eval_all = jax.jit(jax.vmap(evaluate_one)).lower(params, eval_keys).compile()
    t3 = time.perf_counter()
    returns = np.asarray(jax.block_until_ready(eval_all(params, eval_keys)))  # [seeds, eval_episodes]
    t4 = time.perf_counter()
    per_seed = returns.mean(axis=1)
    curve_sum, curve_count = np.asarray(curve_sum).sum(axis=0), np.asarray(curve_count).sum(axis=0)
    steps = seeds * settings.iterations * settings.num_envs
    device = jax.devices()[0]
    return {
        "seeds": seeds, "first_seed": first_seed, "env_steps_per_seed": settings.iterations * settings.num_envs,
        "env_steps": steps,
        "returns": [round(float(r), 3) for r in per_seed], "return_mean": float(per_seed.mean()),
        "return_min": float(per_seed.min()), "return_max": float(per_seed.max()),
        "curve": [round(float(a / b), 2) if b else None for a, b in zip(curve_sum, curve_count)],
        "compile_train_s": round(t1 - t0, 3), "compile_eval_s": round(t3 - t2, 3),
        "compile_s": round(t1 - t0 + t3 - t2, 3),
        "run_s": round(t2 - t1, 3), "eval_s": round(t4 - t3, 3), "train_s": round(t2 - t0, 3),
        "total_s": round(t4 - start, 3), "env_steps_per_s": round(steps / (t2 - t0), 1),
        "env_steps_per_s_run": round(steps / (t2 - t1), 1),
        "device": f"{device.platform}:{getattr(device, 'device_kind', '')}", "jax": jax.__version__,
        "settings": dataclasses.asdict(settings),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peers.jax_dqn_cartpole", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=1, help="S seeds, vmapped in one jit")
    ap.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0: seeds 0..S-1)")
    ap.add_argument("--settings", help="JSON of Settings fields (the rest: cartpole_cleanrl's)")
    ap.add_argument("--env-steps", type=int, help="env steps per seed (overrides the settings')")
    ap.add_argument("--out", help="write the result JSON here")
    args = ap.parse_args(argv)
    try:
        check_seeds(args.seeds, args.first_seed)
    except ValueError as exc:
        ap.error(str(exc))  # one line, exit 2
    from bench.peers import missing

    absent = missing()
    if absent:
        print(f"JAX peer: {', '.join(absent)} not installed (pip install -e '.[peers]')", file=sys.stderr)
        return 3
    settings = Settings.from_json(args.settings) if args.settings else Settings()
    if args.env_steps is not None:
        settings = dataclasses.replace(settings, total_env_steps=args.env_steps)
    result = train(args.seeds, settings, args.first_seed)
    text = json.dumps(result)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(f"JAX peer, {result['seeds']} seeds x {result['env_steps_per_seed']} env steps on {result['device']}: "
          f"greedy return {result['return_mean']:.1f} [{result['return_min']:.1f}, {result['return_max']:.1f}], "
          f"compile {result['compile_s']:.1f} s, training {result['run_s']:.1f} s "
          f"({result['env_steps_per_s_run']:.0f} env steps/s), evaluation {result['eval_s']:.1f} s; "
          f"training curve {result['curve']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
