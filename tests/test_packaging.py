"""The wheel's package list (pyproject.toml) names every package of foxdqn/ and ships conf/."""
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
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "foxdqn").rglob("__init__.py")}
    assert set(project["packages"]) == folders | {"foxdqn.conf"}
    assert project["package-dir"] == {"foxdqn.conf": "conf"}


def test_conf_is_the_package_foxdqn_conf():
    import foxdqn.conf

    assert Path(foxdqn.conf.__file__).resolve().parent == ROOT / "conf"
