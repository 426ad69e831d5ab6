"""Install a plugin package from its source folder into a temporary location, the fast way (no build step).

Copies the package folder(s) that the source's pyproject.toml declares and writes ``NAME-VERSION.dist-info/``
(``METADATA``, ``entry_points.txt`` from ``[project.entry-points]``, ``top_level.txt``) beside them, which is
what ``importlib.metadata`` reads (ENVIRONMENT.md, Plugins). Putting the target on ``sys.path`` (or
``PYTHONPATH``) then makes the package's entry points visible, as ``pip install --target`` would.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "docs" / "examples" / "splitinfer-example-plugin"


def install_from_source(src: Path, target: Path) -> Path:
    """Install the package at ``src`` into ``target`` (a folder for sys.path); returns ``target``."""
    meta = tomllib.loads((src / "pyproject.toml").read_text())
    project = meta["project"]
    packages = meta["tool"]["setuptools"]["packages"]
    target.mkdir(parents=True, exist_ok=True)
    for pkg in packages:
        shutil.copytree(src / pkg, target / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    dist = target / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = project.get("entry-points", {})
    (dist / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in eps.items()) + "\n"
        for group, eps in groups.items()))
    (dist / "top_level.txt").write_text("".join(f"{p}\n" for p in packages))
    return target


@pytest.fixture
def clean_plugins():
    """Leave no plugin, component or plugin module behind (registries restored as they were)."""
    from attacks import plugins

    before = {k: dict(r) for k, r in plugins.registries().items()}
    yield
    for p in plugins.loaded():
        plugins.unload(p.name)
    for kind, reg in plugins.registries().items():
        reg.clear()
        reg.update(before[kind])
