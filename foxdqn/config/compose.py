"""Composing a run's config with Hydra, outside ``python -m foxdqn.train`` too: where ``conf/`` is,
the experiments it ships, :func:`load_config` (Hydra's compose API, then
:func:`foxdqn.config.schema.finalize`) and the one-line messages of composition errors.

Used by the tests, the benches, ``foxdqn.analysis.backtest`` and the multirun check of
:mod:`foxdqn.cli.callbacks`; the schema and its checks are :mod:`foxdqn.config.schema`.
"""
from __future__ import annotations

import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from foxdqn.config.schema import (TrainConfig, clone_config, composition_error, field_types, finalize, finalize_object,
                                  to_object)
from foxdqn.errors import ConfigError, FoxdqnError


def conf_folder() -> Path:
    """The config folder: that of the package ``foxdqn.conf`` (a wheel or ``pip install -e .``), or
    ``conf/`` beside ``foxdqn/`` in a source checkout run without installing (``PYTHONPATH=.``). A
    ``foxdqn/conf/`` left by an older checkout with only ``__pycache__`` in it is a namespace package
    without an ``__init__.py``: it is passed over."""
    import importlib.util

    spec = importlib.util.find_spec("foxdqn.conf")
    if spec is not None and spec.origin:
        return Path(spec.origin).parent
    return Path(__file__).resolve().parents[2] / "conf"


def experiment_names() -> list[str]:
    """The experiments shipped in ``conf/experiment/`` (the package ``foxdqn.conf``), sorted."""
    folder = conf_folder().joinpath("experiment")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_config(overrides: list[str], config_name: str = "train") -> TrainConfig:
    """Compose ``config_name`` (conf/) with ``overrides`` through Hydra's compose API and
    :func:`finalize` it. Used by tests, benches and foxdqn.analysis.backtest; when Hydra is already
    initialised (inside ``python -m foxdqn.train``) its search path (``--config-dir``,
    ``hydra.searchpath``) is used as it is.

    Raises:
        ConfigError: any composition or validation problem (one line, naming the key).
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return finalize(_compose(lambda: compose(config_name, overrides=overrides)))
    try:
        with initialize_config_dir(str(conf_folder()), version_base="1.3"):
            return finalize(_compose(lambda: compose(config_name, overrides=overrides)))
    finally:
        GlobalHydra.instance().clear()


class JobComposer:
    """:func:`load_config` for the many jobs of one multirun, composed once per structure.

    A job is composed through Hydra once per structure. A later job whose overrides are those of a
    composed one (its *base*) with only some values changed, each a plain ``key=value`` of a leaf that is no config group (``seed=3``,
    ``optim.lr=1e-3``, ``model.hidden=[8]``; not ``+key``, ``~key``, ``model=mlp`` or ``hydra.*``),
    is derived from its base's config without Hydra or OmegaConf: its values are set on a copy
    of the base's :class:`TrainConfig` before the debug caps (:func:`set_leaf`: the schema's
    type, as OmegaConf would convert it), then :func:`foxdqn.config.schema.finalize_object` applies the
    caps and the checks (far cheaper than a Hydra compose and ``finalize``: docs/bench.md#other-costs).
    A value the plain path cannot set as OmegaConf would (a list, a type it cannot convert) goes
    through OmegaConf (``OmegaConf.update`` on the base's composed config, then
    :func:`finalize`), and anything else is composed. Every finalized config is kept by its
    override list (:meth:`lookup`), so the multirun's check and its launcher compose a job once.
    Needs an initialised Hydra (inside ``python -m foxdqn.train``).

    Raises:
        ConfigError: as :func:`load_config`.
    """

    def __init__(self, config_name: str = "train") -> None:
        self.config_name = config_name
        self._bases: list[tuple[list[str], DictConfig, TrainConfig]] = []  # one per structure composed
        self._done: dict[tuple[str, ...], TrainConfig] = {}
        self._raw: dict[tuple[str, ...], TrainConfig] = {}  # each job's config before finalize (caps, checks)
        self.composed = 0  # jobs composed through Hydra (the rest were derived)

    def lookup(self, overrides: list[str]) -> TrainConfig | None:
        """The finalized config of a job composed before with exactly ``overrides`` (a copy), or None."""
        done = self._done.get(tuple(overrides))
        return None if done is None else clone_config(done)

    def raw(self, overrides: list[str]) -> TrainConfig | None:
        """The config of a job composed before with exactly ``overrides`` as composed, before
        :func:`finalize` (no debug caps applied: what Hydra writes to a job's ``.hydra/config.yaml``),
        or None. Read-only: shared, not a copy."""
        return self._raw.get(tuple(overrides))

    def __call__(self, overrides: list[str]) -> TrainConfig:
        import copy

        done = self.lookup(overrides)
        if done is not None:
            return done
        base, changes = next(((b, c) for b in self._bases for c in [self.value_changes(overrides, b[0], b[1])]
                              if c is not None), (None, None))
        if base is None:
            from hydra import compose

            cfg = _compose(lambda: compose(self.config_name, overrides=overrides))
            self.composed += 1
            tc = finalize(cfg)
            raw = _compose(lambda: to_object(cfg))
            self._bases.append((list(overrides), copy.deepcopy(cfg), raw))
        else:
            obj = clone_config(base[2])
            if all(set_leaf(obj, key, value) for key, value in changes):
                raw = clone_config(obj)
                tc = finalize_object(obj)
            else:  # a value only OmegaConf converts (a list, an odd type): set it as Hydra would
                cfg = copy.deepcopy(base[1])
                for key, value in changes:
                    _compose(lambda: OmegaConf.update(cfg, key, value, merge=True))
                raw = _compose(lambda: to_object(cfg))
                tc = finalize(cfg)
        self._done[tuple(overrides)] = clone_config(tc)
        self._raw[tuple(overrides)] = raw
        return tc

    @staticmethod
    def value_changes(overrides: list[str], first_overrides: list[str],
                      first_cfg: DictConfig) -> list[tuple[str, object]] | None:
        """The (key, value) pairs that turn the job of ``first_overrides`` (composed as
        ``first_cfg``) into the job of ``overrides``, when they differ only in values of plain
        leaves (the class docstring); else None."""
        import copy

        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.override_parser.types import OverrideType

        if len(overrides) != len(first_overrides):
            return None
        loader = GlobalHydra.instance().config_loader()
        changes = []
        for mine, first in zip(overrides, first_overrides):
            if mine == first:
                continue
            try:
                a, b = parsed_override(mine), parsed_override(first)
            except Exception:  # noqa: BLE001 - Hydra reports it when it composes
                return None
            key = a.key_or_group
            plain = (a.type == OverrideType.CHANGE and b.type == OverrideType.CHANGE and key == b.key_or_group
                     and a.package is None and "/" not in key and not key.startswith("hydra"))
            if not plain or a.is_sweep_override():
                return None
            group = key.replace(".", "/")
            if group not in _IS_GROUP:  # the config search path is fixed for the process: ask once per key
                _IS_GROUP[group] = bool(loader.get_group_options(group))
            if _IS_GROUP[group]:
                return None
            node = OmegaConf.select(first_cfg, key, default=None, throw_on_missing=False)
            if isinstance(node, DictConfig):
                return None
            changes.append((key, copy.deepcopy(a.value())))  # the parse is shared: never hand out its list
        return changes


#: Hydra's override parser (made once), each override parsed (once per text) and whether a dotted key
#: names a config group (asked once per key: a lookup in the config repository is slow,
#: docs/bench.md#other-costs).
_PARSER: dict = {}
_PARSED: dict[str, object] = {}
_IS_GROUP: dict[str, bool] = {}


#: ``key=<decimal int>`` (``seed=17``, ``env.num_envs=-3``): the override every seed of a sweep has
#: of its own, built without Hydra's ANTLR parser (about 1 ms a text: 0.4 s for 512 seeds), as
#: that parser builds it (a CHANGE of key ``key`` to the int; tests/config/test_compose_jobs.py)
_PLAIN_INT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)=(-?(?:0|[1-9][0-9]*))")


def parsed_override(text: str):
    """Hydra's parse of one command-line override (``hydra.core.override_parser.types.Override``),
    parsed once per text for the process (a sweep's jobs share all but a few overrides); treat it as
    read-only. A plain ``key=<decimal int>`` is built directly (:data:`_PLAIN_INT`), equal to the
    parser's. Raises Hydra's ``OverrideParseException`` as ``OverridesParser.parse_override``."""
    done = _PARSED.get(text)
    if done is None:
        plain = _PLAIN_INT.fullmatch(text)
        if plain is not None:
            from hydra.core.override_parser.types import Override, OverrideType, ValueType

            done = _PARSED[text] = Override(type=OverrideType.CHANGE, key_or_group=plain[1],
                                            value_type=ValueType.ELEMENT, _value=int(plain[2]), input_line=text)
            return done
        from hydra.core.override_parser.overrides_parser import OverridesParser

        done = _PARSED[text] = _PARSER.setdefault("parser", OverridesParser.create()).parse_override(text)
    return done

#: The composer of each config name for this process's multirun: the check of every job
#: (foxdqn.cli.callbacks.CheckJobs) and the population launcher share it, so a job is composed once.
_SWEEP_COMPOSERS: dict[str, JobComposer] = {}


def sweep_composer(config_name: str) -> JobComposer:
    """The process-wide :class:`JobComposer` of ``config_name`` (made on first use)."""
    return _SWEEP_COMPOSERS.setdefault(config_name, JobComposer(config_name))


def set_leaf(obj: TrainConfig, dotted: str, value) -> bool:
    """Set the scalar leaf ``dotted`` (``optim.lr``) of ``obj`` to ``value`` (a value from Hydra's
    override parser) converted to the schema's type as OmegaConf converts it (an int for a float
    field, a choice's name for a choice, null for an Optional field). Returns False, changing
    nothing, when that is not certain: an unknown key, a non-scalar field or value, a value the
    type does not take (the caller then lets OmegaConf set it, and report its error)."""
    import dataclasses
    import typing
    from enum import Enum

    *parents, leaf = dotted.split(".")
    node = obj
    for part in parents:
        node = getattr(node, part, None)
        if not dataclasses.is_dataclass(node):
            return False
    fields = {f.name: f for f in dataclasses.fields(node)}
    if leaf not in fields:
        return False
    kind = field_types(type(node)).get(leaf)
    optional = typing.get_origin(kind) is typing.Union and type(None) in typing.get_args(kind)
    if optional:
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if value is None:
        if not optional:
            return False
        setattr(node, leaf, None)
        return True
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif kind is str:
        ok = isinstance(value, str)
    elif isinstance(kind, type) and issubclass(kind, Enum):
        ok = isinstance(value, str) and value in kind.__members__
        value = kind[value] if ok else value
    else:
        ok = False
    if ok:
        setattr(node, leaf, value)
    return ok


def _compose(make) -> DictConfig:
    try:
        return make()
    except FoxdqnError:
        raise
    except Exception as exc:  # hydra / omegaconf errors: unknown key, wrong type, missing option
        raise ConfigError(composition_error(exc)) from None


def from_plain(values: dict) -> TrainConfig:
    """A :class:`TrainConfig` from :func:`to_plain`'s dicts (a checkpoint's config).

    Raises:
        ConfigError: keys or values this version's schema does not accept.
    """
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), values))
    except Exception as exc:  # noqa: BLE001 - omegaconf validation errors
        raise ConfigError(composition_error(exc)) from None
