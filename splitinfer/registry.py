"""Name registries of classes filled by decorators: the attack recipes and the defenses share these three steps.

:func:`claim` puts a checked class under its name (a re-import of the same
class is no clash; another class under a taken name is),
:func:`import_modules` imports a package's modules once so that their
decorators run, and :func:`lookup` returns the class of a name or a
one-line error listing the known names. A leaf module: it imports nothing
of the project.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from pathlib import Path


def claim(registry: dict[str, type], name: str, cls: type, kind: str, error: type[Exception]) -> type:
    """Register ``cls`` as ``name`` in ``registry`` and set ``cls.name``; ``error`` if another class holds it."""
    old = registry.get(name)
    if old is not None and old.__qualname__ != cls.__qualname__:
        raise error(f"{kind} name {name!r} is registered twice ({old.__module__}.{old.__qualname__}, "
                    f"{cls.__module__}.{cls.__qualname__}); rename one (a plugin may not reuse a built-in's name)")
    cls.name = name
    registry[name] = cls
    return cls


_IMPORTED: set[str] = set()  # packages whose modules import_modules has imported


def import_modules(package: str, directory: str | Path, skip: Iterable[str] = ()) -> None:
    """Import every public module of ``package`` found in ``directory`` (``_private`` ones and ``skip`` left out).

    Once per package: a later call for the same package does nothing.
    """
    if package in _IMPORTED:
        return
    skip = set(skip)
    for mod in pkgutil.iter_modules([str(directory)]):
        if mod.name not in skip and not mod.name.startswith("_"):
            importlib.import_module(f"{package}.{mod.name}")
    _IMPORTED.add(package)


def lookup(registry: dict[str, type], name: str, kind: str, error: type[Exception], hint: str,
           also: Iterable[str] = ()) -> type:
    """``registry[name]``, or ``error`` naming the known names (``also`` first, e.g. ``none``) and ``hint``."""
    if name not in registry:
        known = ", ".join([*also, *sorted(registry)])
        raise error(f"unknown {kind} {name!r}; choose one of {known} ({hint})")
    return registry[name]
