"""Checks before any work (:func:`preflight`) and the market data a job trains on
(:func:`market_data`, loaded once per process and data setting)."""
from __future__ import annotations

from foxdqn.config.schema import TrainConfig
from foxdqn.errors import ConfigError
from foxdqn.job.memory import available_bytes, replay_row, replays_that_fit
from foxdqn.timings import mark


def preflight(tc: TrainConfig):
    """What can be checked before any work, beyond the config itself (a resume's checkpoint is
    checked by :func:`foxdqn.run.resume.resolve_resume`): the data loads and is valid, a Gymnasium env exists with a Discrete action space
    that the encoder can read, the replay memory fits, for ``logger=mlflow`` mlflow is installed
    and its store opens, for ``logger=wandb`` wandb is installed (and logged in when online), for
    ``search.pruner=median`` optuna is installed, and the Prometheus port (``logger.prometheus.port``) can be bound now.
    Returns the market data (None for envs other than trading).

    Raises:
        FoxdqnError: ConfigError or DataError, naming the key, file or row.
    """
    # start-up: foxdqn.train imports this module; the imports below stay here, off the path of --help
    from foxdqn.replay.buffer import replay_bytes  # the replay's Triton ops

    if tc.logger.mlflow:
        from foxdqn.logger.mlflow_log import check_store  # foxdqn.logger (rich), for logger=mlflow only

        try:
            check_store(tc.logger.mlflow_uri)
        except ImportError as exc:
            raise ConfigError(str(exc)) from None
        except ValueError as exc:
            raise ConfigError(f"logger.mlflow_uri: the MLflow store {exc}") from None
    if tc.logger.wandb:
        from foxdqn.logger.wandb_log import check  # foxdqn.logger (rich), for logger=wandb only

        try:
            check(str(tc.logger.wandb_mode))
        except (ImportError, PermissionError) as exc:
            raise ConfigError(str(exc)) from None
    if tc.search.pruner == "median":
        try:
            import optuna  # noqa: F401
        except ImportError:
            raise ConfigError("search.pruner=median needs optuna: pip install 'foxdqn[sweep]' (or pip install "
                              "optuna)") from None
    if tc.logger.prometheus.port is not None:  # a port in use fails here, before any folder is made
        from foxdqn.logger.prometheus_log import probe  # foxdqn.logger (rich), with a port only

        try:
            probe(tc.logger.prometheus.port, tc.logger.prometheus.addr)
        except OSError as exc:
            raise tc.logger.prometheus.bind_error(exc) from None
    mark("preflight")
    market = market_data(tc)
    mark("data_load")
    itemsize = 4
    if tc.env.name == "gym":  # unknown id / non-Discrete actions fail here
        import math

        from foxdqn.envs.gym_adapter import describe  # gymnasium, for env=gym only
        from foxdqn.step.build import check_encoder  # step.build imports the replay's Triton ops

        spaces = describe(tc.env)
        check_encoder(tc.model.encoder, spaces["obs_shape"], tc.env.id)
        obs_dim, itemsize = math.prod(spaces["obs_shape"]), spaces["obs_dtype"].itemsize
    else:
        obs_dim, itemsize = replay_row(tc, market)
    need, free = replay_bytes(tc.replay.capacity, obs_dim, itemsize, tc.regime.enabled), available_bytes(tc.device)
    if replays_that_fit(need, free) == 0:
        raise ConfigError(f"replay.capacity={tc.replay.capacity} needs {need / 2**30:.1f} GiB for stored states "
                          f"of {obs_dim} values, more than the {free / 2**30:.1f} GiB free; lower replay.capacity")
    return market


def market_data(tc: TrainConfig):
    """The run's market data (None for envs other than trading), loaded once per process and data
    setting: a multirun's precheck and its jobs share the load."""
    if tc.env.name != "trading":
        return None
    key = (repr(tc.data), tc.env.window, tc.env.episode_length)
    if key not in _MARKETS:
        _MARKETS.clear()  # one dataset at a time: a sweep over files does not pile them up
        from foxdqn.data import load_market_data

        _MARKETS[key] = load_market_data(tc.data, tc.env.window, tc.env.episode_length)
    return _MARKETS[key]


_MARKETS: dict = {}
