"""The wheel's package list (pyproject.toml) names every package of foxdqn/ and of foxdqn's Hydra
plugin in hydra_plugins/ (Hydra's namespace package: no __init__.py of its own), and ships conf/."""
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = None

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(tomllib is None, reason="tomllib needs Python 3.11")
def test_every_package_folder_is_listed():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {".".join(p.parent.relative_to(ROOT).parts)
               for top in ("foxdqn", "hydra_plugins") for p in (ROOT / top).rglob("__init__.py")}
    assert "hydra_plugins.foxdqn_population" in folders
    assert set(project["packages"]) == folders | {"foxdqn.conf"}
    assert not (ROOT / "hydra_plugins" / "__init__.py").exists()  # one namespace with the installed plugins
    assert project["package-dir"] == {"foxdqn.conf": "conf"}


def test_conf_is_the_package_foxdqn_conf():
    import foxdqn.conf

    assert Path(foxdqn.conf.__file__).resolve().parent == ROOT / "conf"


@pytest.mark.parametrize("stale", [False, True])
def test_a_source_checkout_without_install_reads_conf_beside_the_package(monkeypatch, tmp_path, stale):
    """PYTHONPATH=. in a clone (no pip install): foxdqn.conf is not importable, or is the namespace
    package of a foxdqn/conf/ that an older checkout left with only __pycache__ in it: conf/ is used."""
    import importlib.machinery
    import importlib.util

    from foxdqn.config import compose as config

    real = importlib.util.find_spec
    namespace = importlib.machinery.ModuleSpec("foxdqn.conf", None, is_package=True)
    namespace.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (namespace if stale else None) if name == "foxdqn.conf" else real(name, *a))
    assert config.conf_folder() == ROOT / "conf"
    assert "eurusd_dqn" in config.experiment_names()
    assert config.load_config(["+experiment=cartpole_dqn"]).target.period == 32
