"""Replay ring buffer on the training device, time-major, with n-step returns built at sample time.

Storage is ``[T, N, ...]``: one time row per collect step of the N envs, so the transitions of
one env are consecutive rows of its column. That makes n-step returns (and HER's "future" goals,
``her.py``) a fixed-shape gather at sample time instead of per-env bookkeeping at insert time:

    R_t = Σ_{k<m} γ^k r_{t+k},   discount = γ^m · (1 − terminal_{t+m−1}),   s' = next_obs_{t+m−1}

where m ≤ n stops at the first step that ended the episode (terminated or truncated), so a
window never crosses an episode boundary (Sutton & Barto 2018, §7.1; Hessel et al. 2018). The
n−1 newest time rows are not sampled (their windows are not complete yet).

All bookkeeping (write row, rows written) is in device tensors: :meth:`ReplayBuffer.add` and
:meth:`ReplayBuffer.sample` never read device memory into Python and run inside a CUDA graph.

The stored s and s' rows are the observations themselves, or, with a decoder
(:meth:`ReplayBuffer.set_decoder`, an env's :class:`ReplayCodec`), a compact code of each state
that the decoder turns into observations after sampling (the trading env's state codes:
docs/design/replay.md#windowed-trading-replay).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from foxdqn.ops.regime_weight import regime_weight
from foxdqn.ops.replay_add import replay_add
from foxdqn.ops.replay_gather import replay_gather, rows_from_uniforms
from foxdqn.ops.tensor_list import scratch
from foxdqn.device.scalars import device_scalar


def replay_bytes(capacity: int, obs_dim: int, obs_itemsize: int = 4, regime: bool = False) -> int:
    """Bytes a :class:`ReplayBuffer` of ``capacity`` transitions takes: the obs and next_obs rows
    of ``obs_dim`` values of ``obs_itemsize`` bytes (the observations: 4 for float32, 1 for uint8
    images; or a decoder's codes, e.g. the trading env's 4 values of 4 or 8 bytes:
    :func:`foxdqn.job.memory.replay_row`), action and episode int64, reward/terminal/ended float32, and
    with ``regime`` the float32 volatility ratio of ``regime.enabled``."""
    return capacity * (2 * obs_dim * obs_itemsize + 2 * 8 + (4 if regime else 3) * 4)


class ReplayCodec(NamedTuple):
    """How an env's observations are stored in the replay (its hook's ``replay_codec``).

    dim: values per stored row.  dtype: their dtype.  decode: ``(rows, next_rows, index) ->
    (obs, next_obs)``: sampled rows ``[B, dim]`` of s and s' and their flat replay rows ``index``
    (int64 ``[B]``, ``t·N + e``) to observations ``[B, obs_dim]`` of the env's ``obs_dtype``; device
    ops only (it runs inside the captured update). A population's replay also passes ``members=P``
    (its member-major batch; :meth:`ReplayBuffer.decode`'s ``decoder_args``).
    """

    dim: int
    dtype: torch.dtype
    decode: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class Batch(NamedTuple):
    """A sampled batch (all on the device).

    obs, next_obs: [B, D] of the replay's obs dtype (float32; uint8 for images; with a decoder: the
    decoded observations, [B, env obs_dim] of the env's obs dtype); action: int64 [B]; reward:
    float32 [B], the n-step discounted reward sum; discount: float32 [B], γ^m or 0 where the
    episode terminated in the window;
    weight: float32 [B] importance weights (ones for uniform); index: int64 [B] flat rows t·N + e;
    next_code: with a decoder, the stored rows of s' that next_obs was decoded from ([B, code
    dim], the trading env's state codes: the switch penalty of the target's argmax reads them,
    :mod:`foxdqn.actions.switch`), else None.
    From :meth:`ReplayBuffer.sample` obs and next_obs are the two halves of one [2B, D] tensor
    (:func:`foxdqn.ops.replay_gather.stacked_pair`); from ``MemberReplay.sample_members`` of P > 1
    members they are [P, B, D] views.
    """

    obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    next_obs: torch.Tensor
    discount: torch.Tensor
    weight: torch.Tensor
    index: torch.Tensor
    next_code: torch.Tensor | None = None


class ReplayBuffer:
    """Uniform replay of transitions (s, a, r, s', terminal, episode end).

    Args:
        capacity: transitions kept (rounded down to a multiple of ``num_envs``).
        num_envs: N, transitions written per :meth:`add`.
        obs_dim: D, values per stored obs / next_obs row (the observation, or its code when a
            decoder is set: :meth:`set_decoder`).
        device: where everything lives.
        n_step: n ≥ 1 (``replay.n_step``).
        gamma: discount γ per env step.
        obs_dtype: storage dtype of obs and next_obs (float32; uint8 for image observations, which
            the encoder scales, e.g. foxdqn.nn.nature_cnn; a codec's dtype); sampled batches keep
            it unless a decoder is set.

    Raises:
        ValueError: ``capacity`` < (``n_step`` + 1) · ``num_envs``, or ``n_step`` < 1.
    """

    def __init__(self, capacity: int, num_envs: int, obs_dim: int, device: torch.device, n_step: int = 1,
                 gamma: float = 0.99, obs_dtype: torch.dtype = torch.float32):
        if n_step < 1:
            raise ValueError(f"ReplayBuffer: n_step must be >= 1, got n_step={n_step}")
        rows = capacity // num_envs
        if rows < n_step + 1:
            raise ValueError(f"ReplayBuffer: capacity={capacity} must hold at least (n_step + 1) * num_envs = "
                             f"{(n_step + 1) * num_envs} transitions")
        self.rows, self.num_envs, self.obs_dim = rows, num_envs, obs_dim
        self.capacity = rows * num_envs
        self.device, self.n_step, self.gamma = device, n_step, gamma
        f32 = dict(device=device, dtype=torch.float32)
        self.obs_dtype = obs_dtype
        self.obs = torch.zeros(rows, num_envs, obs_dim, device=device, dtype=obs_dtype)
        self.next_obs = torch.zeros(rows, num_envs, obs_dim, device=device, dtype=obs_dtype)
        self.action = torch.zeros(rows, num_envs, dtype=torch.int64, device=device)
        self.reward = torch.zeros(rows, num_envs, **f32)
        self.terminal = torch.zeros(rows, num_envs, **f32)  # 1.0: s' is terminal (no bootstrap)
        self.ended = torch.zeros(rows, num_envs, **f32)  # 1.0: the episode ended here (terminal or truncated)
        self.episode = torch.zeros(rows, num_envs, dtype=torch.int64, device=device)  # per-env episode number
        self.ptr = torch.zeros((), dtype=torch.int64, device=device)  # next time row to write
        self.written = torch.zeros((), dtype=torch.int64, device=device)  # time rows ever written
        self._episode_now = torch.zeros(num_envs, dtype=torch.int64, device=device)
        scratch("replay_add", device, 1)  # the add op's ticket, made now (before any graph capture), shared per device
        self._gamma_m = (gamma ** torch.arange(n_step + 1, device=device, dtype=torch.float64)).to(torch.float32)
        self.relabeler = None  # a her.HindsightRelabeler for goal-conditioned envs
        self.regime = None  # a regime.RegimeWeights (regime.enabled)
        self.vol_ratio = None  # float32 [T, N] volatility ratio of each transition's state (regime)
        self._weights: torch.Tensor | None = None  # ones [B] of uniform sampling, made at the first sample
        self.decoder = None  # stored rows -> observations (set_decoder)

    def set_relabeler(self, relabeler) -> None:
        """Attach HER (``replay.her``); needs ``n_step == 1``.

        Raises:
            ValueError: the buffer's ``n_step`` is not 1, or a decoder is set.
        """
        if self.n_step != 1:
            raise ValueError(f"ReplayBuffer.set_relabeler: hindsight relabelling (her) needs n_step=1, "
                             f"got n_step={self.n_step}")
        if self.decoder is not None:
            raise ValueError("ReplayBuffer.set_relabeler: hindsight relabelling (her) reads the stored observations; "
                             "it cannot be combined with a decoder")
        self.relabeler = relabeler

    def set_decoder(self, decoder) -> None:
        """Store codes instead of observations: ``obs_dim`` / ``obs_dtype`` are the code's, :meth:`add`
        takes code rows, and sampled batches carry ``decoder(obs_rows, next_obs_rows, index)``
        (:attr:`ReplayCodec.decode`) as obs and next_obs. Not with HER (it reads stored
        observations).

        Raises:
            ValueError: a relabeler (HER) is attached.
        """
        if self.relabeler is not None:
            raise ValueError("ReplayBuffer.set_decoder: hindsight relabelling (her) reads the stored observations; "
                             "it cannot be combined with a decoder")
        self.decoder = decoder

    def decode(self, batch: Batch, **decoder_args) -> Batch:
        """``batch`` with its stored rows decoded into observations, the rows of s' kept as
        ``next_code`` (unchanged without a decoder). ``decoder_args``: passed to the decoder (a
        population's ``members``, :meth:`foxdqn.population.replay.MemberReplay.sample_members`)."""
        if self.decoder is None:
            return batch
        obs, next_obs = self.decoder(batch.obs, batch.next_obs, batch.index, **decoder_args)
        return batch._replace(obs=obs, next_obs=next_obs, next_code=batch.next_obs)

    def set_regime(self, regime) -> None:
        """Attach regime weights (``regime.enabled``, :mod:`foxdqn.replay.regime`): allocates the
        float32 [T, N] volatility-ratio column; :meth:`add` then needs ``vol_ratio`` and sampled
        weights are multiplied by ``regime(vol_ratio)``."""
        self.regime = regime
        self.vol_ratio = torch.ones(self.rows, self.num_envs, device=self.device, dtype=torch.float32)

    # ---------------------------------------------------------------- insert
    def add(self, obs, action, reward, next_obs, terminated, truncated, vol_ratio=None, *,
            reward_scale: float | torch.Tensor = 1.0, advance_obs=None, rollout=None, backend: str = "auto") -> None:
        """Write one time row: N transitions, and advance the write row (one kernel on CUDA,
        :func:`foxdqn.ops.replay_add.replay_add`; PER's priorities are a second op).

        Args:
            obs, next_obs: ``[N, D]`` (or ``[N, *obs_shape]``), cast to the storage dtype.
            action: int64 ``[N]``.  reward: float32/float64 ``[N]``, stored times ``reward_scale``
                (as float32).  terminated, truncated: bool ``[N]``.
            vol_ratio: float32 ``[N]``, the state's volatility ratio: required after
                :meth:`set_regime`, ignored otherwise.
            reward_scale: a float (a run's ``loss.reward_scale``) or a float32/float64 ``[G]`` device
                tensor, one scale per group of N / G envs (a population's members).
            advance_obs: the observations to act on next (``[N, ...]``) or None; when given, they
                are copied into ``rollout`` after the row is stored.
            rollout: the observations the agent acts on (contiguous ``[N, ...]``; may be ``obs``
                itself), given exactly with ``advance_obs``.
            backend: of the op: "auto", "triton" or "torch".

        Raises:
            ValueError: ``vol_ratio`` missing with regime weights, ``advance_obs`` without
                ``rollout`` or the reverse, or a wrong shape or dtype.
        """
        if (advance_obs is None) != (rollout is None):
            raise ValueError("ReplayBuffer.add: advance_obs and rollout are given together (the next observations "
                             "and the buffer they are copied into)")
        if self.vol_ratio is not None:
            if vol_ratio is None:
                raise ValueError("replay with regime weights: add() needs vol_ratio [N]")
        else:
            vol_ratio = None
        n = self.num_envs
        if not isinstance(reward_scale, torch.Tensor):
            reward_scale = device_scalar(self.device, float(reward_scale), torch.float64)  # made once per value
        self._after_add(self.ptr.view(1))  # before the op advances ptr
        columns = {"obs": self.obs, "next_obs": self.next_obs, "action": self.action, "reward": self.reward,
                   "terminal": self.terminal, "ended": self.ended, "episode": self.episode,
                   "vol_ratio": self.vol_ratio}
        replay_add(obs.reshape(n, -1), next_obs.reshape(n, -1),
                   action, reward, reward_scale.reshape(-1), terminated, truncated, columns, self._episode_now,
                   self.ptr, self.written, scratch("replay_add", self.device, 1)[1], vol_ratio=vol_ratio,
                   advance_obs=None if advance_obs is None else advance_obs.reshape(n, -1),
                   rollout=None if rollout is None else rollout.view(n, -1), backend=backend)

    def _after_add(self, row: torch.Tensor) -> None:
        """Hook for subclasses (PER sets the priorities of the new rows), called before the row is
        written; row: int64 [1], a view of ``ptr`` (read it before :meth:`add` returns)."""

    # ---------------------------------------------------------------- sample
    def filled(self) -> torch.Tensor:
        """Time rows holding data (int64 0-d)."""
        return torch.clamp(self.written, max=self.rows)

    def age(self, t: torch.Tensor) -> torch.Tensor:
        """Rows written after row ``t`` (0 = newest row), int64 like ``t``."""
        return (self.ptr - 1 - t) % self.rows

    def sample_index(self, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(flat rows int64 [B], weights float32 [B]): uniform (time row, env) over the rows whose
        n-step window is complete (:func:`foxdqn.ops.replay_gather.rows_from_uniforms` of
        ``torch.rand(2, B)``); the weights are ones, one tensor kept across calls (read-only)."""
        u = torch.rand(2, batch_size, device=self.device, generator=generator)
        index = rows_from_uniforms(u, self.ptr, self.written, self.rows, self.num_envs, self.n_step)
        return index, self._ones(batch_size)

    def gather(self, index: torch.Tensor, weight: torch.Tensor, stacked: bool = False) -> Batch:
        """n-step batch for flat rows ``index`` (int64 [B]): one kernel on CUDA
        (:func:`foxdqn.ops.replay_gather.replay_gather`; ``stacked``: obs and next_obs are the two
        halves of one [2B, D] tensor)."""
        return self._batch(replay_gather(*self._ring(), index=index, stacked=stacked), weight)

    def _ring(self) -> tuple:
        """The storage and γ table arguments of :func:`foxdqn.ops.replay_gather.replay_gather`."""
        return (self.obs, self.next_obs, self.action, self.reward, self.terminal, self.ended, self.ptr,
                self.written, self._gamma_table(), self.n_step)

    @staticmethod
    def _batch(g, weight: torch.Tensor) -> Batch:
        return Batch(g.obs, g.action, g.reward, g.next_obs, g.discount, weight, g.index)

    def _ones(self, batch_size: int) -> torch.Tensor:
        """float32 ones [batch_size], made once (uniform replay's importance weights; read-only)."""
        if self._weights is None or self._weights.numel() != batch_size:
            self._weights = torch.ones(batch_size, device=self.device)
        return self._weights

    def _gamma_table(self) -> torch.Tensor:
        """float32 ``[G, n + 1]``: row g = γ_g^0 .. γ_g^n of env group g = e // (N / G); here G = 1
        (one γ); a subclass with a γ per group of envs returns its own table."""
        return self._gamma_m[None]

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """A batch of ``batch_size`` n-step transitions, drawn with ``generator``.

        Without regime weights and HER: the draw (``torch.rand(2, B)``, or PER's rows) and one
        gather kernel, obs and next_obs stacked (:func:`foxdqn.ops.replay_gather.stacked_pair`)
        unless stored state codes are decoded (:meth:`set_decoder`, one more kernel);
        the rows are those of :meth:`sample_index`. With regime weights or HER: the torch sampling
        path, then the same gather kernel on the rows."""
        if self.regime is None and self.relabeler is None:  # stored state codes are decoded apart
            return self.decode(self._sample_stacked(batch_size, generator, stacked=self.decoder is None))
        index, weight = self.sample_index(batch_size, generator)
        if self.regime is not None:  # w_b = w_b^PER · w_regime(b) (foxdqn.replay.regime)
            g = self.regime
            weight = regime_weight(self.vol_ratio.view(-1), index, weight, g.low, g.high, g.weights)
        batch = self.decode(self.gather(index, weight))
        if self.relabeler is not None:
            batch = self.relabeler.relabel(self, batch, generator)
        return batch

    def _sample_stacked(self, batch_size: int, generator: torch.Generator, stacked: bool = True) -> Batch:
        """Uniform draw and gather in one kernel (the draws of :meth:`sample_index`); ``stacked``: obs
        and next_obs in one [2B, D] tensor."""
        u = torch.rand(2, batch_size, device=self.device, generator=generator)
        return self._batch(replay_gather(*self._ring(), uniforms=u, stacked=stacked), self._ones(batch_size))

    def update_priorities(self, index: torch.Tensor, td_abs: torch.Tensor, skip: torch.Tensor) -> None:
        """No-op for uniform replay (PER overrides)."""

    def state_dict(self) -> dict:
        names = ("obs", "next_obs", "action", "reward", "terminal", "ended", "episode", "ptr", "written")
        extra = {} if self.vol_ratio is None else {"vol_ratio": self.vol_ratio}
        return {**{k: getattr(self, k) for k in names}, **extra}
