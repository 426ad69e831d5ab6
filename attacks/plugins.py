"""Third-party components: entry points and ``--plugin`` modules for every registry, with their provenance.

A plugin is a Python module that registers components with the decorators the built-ins use
(``@register_attack``, ``@register_defense``, ``@register_proposer``, ``@register_corpus``). It is found

- through an entry point of an installed distribution, in one of :data:`GROUPS`
  (``[project.entry-points."splitinfer.defenses"] hidden-mix = "my_pkg.mixing"``): :func:`discover`
  imports every one, once, without any flag (the pattern of pytest's ``pytest11`` plugins);
- or by name: ``--plugin MODULE`` on the command line, ``plugins = [...]`` in a suite file, or
  :func:`load_module` (a dotted module name, or a ``.py`` file path).

Loading a plugin imports its module with the built-ins already registered, and compares every registry
before and after: a plugin that claims a built-in's name, fails to import, or declares what a registry
refuses (an unknown threat model, ...) gets one :class:`PluginError` line naming the plugin, the component
where known and the fix, and leaves every registry as it was. :func:`records` is each plugin's provenance
(distribution, version, sha256 of its source files, its components), which every results document keeps
under ``config.plugins`` (:mod:`benchmarks.schema`); ``bench merge`` and ``regress`` treat a changed
digest like a code change.

This module lives in ``attacks``, the lowest layer that sees all four registries (the layering rule,
DESIGN.md section 7): ``splitinfer`` itself never imports it except in its two composer modules.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attacks.errors import AttackError
from splitinfer.errors import SplitInferError

log = logging.getLogger(__name__)

__all__ = ["GROUPS", "Plugin", "PluginError", "discover", "droppable", "failures", "load_module", "load_modules",
           "loaded", "origin", "records", "registries", "source_digest", "unload"]

GROUPS = {"splitinfer.attacks": "attack", "splitinfer.defenses": "defense", "splitinfer.proposers": "proposer",
          "splitinfer.corpora": "corpus"}


class PluginError(SplitInferError):
    """A plugin could not be loaded (the message names the plugin, the component and the fix)."""


@dataclass(frozen=True)
class Plugin:
    """One loaded plugin: its top-level package (or module), where it came from and what it registered."""

    name: str  # top-level package or module name
    source: str  # "entry point GROUP:NAME" or "--plugin"
    dist: str | None  # distribution name (None: a module that no installed distribution owns)
    version: str | None
    digest: str  # sha256 over its source files (relative path and bytes)
    files: int
    components: dict[str, tuple[str, ...]] = field(default_factory=dict)  # kind -> names

    def record(self) -> dict[str, Any]:
        """What a results document keeps (``config.plugins``)."""
        return {"name": self.name, "dist": self.dist, "version": self.version, "digest": self.digest,
                "files": self.files, "source": self.source,
                "components": {k: list(v) for k, v in sorted(self.components.items())}}


_LOADED: dict[str, Plugin] = {}  # top-level name -> Plugin
_FAILED: list[str] = []  # one line per entry point that failed to load during discovery
_DISCOVERED = False


def registries() -> dict[str, dict]:
    """{kind: the live registry} with every built-in loaded (a plugin is compared against these)."""
    from attacks.registry import registered_attacks
    from splitinfer.corpora.registry import registered_corpora
    from splitinfer.decoding.base import registered_proposers
    from splitinfer.defenses.base import registered_defenses

    return {"attack": registered_attacks(), "defense": registered_defenses(), "proposer": registered_proposers(),
            "corpus": registered_corpora()}


def _source_files(top: str, path: Path | None) -> list[Path]:
    """The .py files of the top-level package ``top`` (or the single module file)."""
    if path is not None:
        return [path]
    spec = importlib.util.find_spec(top)
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return sorted(p for d in spec.submodule_search_locations for p in Path(d).rglob("*.py"))
    return [Path(spec.origin)] if spec.origin and spec.origin.endswith(".py") else []


def source_digest(files: list[Path]) -> str:
    """sha256 over ``files`` (name relative to their common folder, then bytes), in path order."""
    h = hashlib.sha256()
    if not files:
        return h.hexdigest()
    root = Path(*Path(files[0]).parts[:-1]) if len(files) == 1 else Path(_common(files))
    for f in sorted(files):
        h.update(Path(f).relative_to(root).as_posix().encode() + b"\0" + Path(f).read_bytes() + b"\0")
    return h.hexdigest()


def _common(files: list[Path]) -> str:
    import os

    return os.path.commonpath([str(Path(f).parent) for f in files])


def _owner(top: str) -> tuple[str | None, str | None]:
    """(distribution, version) that installs the top-level name ``top``, or (None, None)."""
    dists = importlib.metadata.packages_distributions().get(top) or []
    if not dists:
        return None, None
    try:
        return dists[0], importlib.metadata.version(dists[0])
    except importlib.metadata.PackageNotFoundError:
        return dists[0], None


def _restore(regs: dict[str, dict], before: dict[str, dict]) -> None:
    for kind, reg in regs.items():
        reg.clear()
        reg.update(before[kind])


def _import(module: str, label: str, path: Path | None) -> dict[str, tuple[str, ...]]:
    """Import a plugin module against snapshots of every registry; {kind: names it added}; PluginError else."""
    regs = registries()
    before = {k: dict(r) for k, r in regs.items()}
    try:
        if path is not None:
            spec = importlib.util.spec_from_file_location(module, path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[module] = mod
            try:
                spec.loader.exec_module(mod)
            except BaseException:
                sys.modules.pop(module, None)
                raise
        else:
            importlib.import_module(module)
    except (AttackError, SplitInferError) as e:  # a registry refused a component: its message names it
        _restore(regs, before)
        raise PluginError(f"plugin {label}: {e}") from None
    except Exception as e:  # noqa: BLE001 - any import failure of foreign code is one line
        _restore(regs, before)
        raise PluginError(f"plugin {label} failed to import ({type(e).__name__}: {e}); install what it needs "
                          "or correct the module name, then rerun") from None
    for kind, reg in regs.items():
        for name, old in before[kind].items():
            if reg.get(name) is not old:
                _restore(regs, before)
                sys.modules.pop(module, None)
                raise PluginError(f"plugin {label}: {kind} {name!r} clashes with a built-in or an earlier plugin "
                                  f"({origin(kind, name) or 'built-in'}); register it under another name")
    return {k: tuple(sorted(set(r) - set(before[k]))) for k, r in regs.items() if set(r) - set(before[k])}


def _add(top: str, source: str, path: Path | None, added: dict[str, tuple[str, ...]]) -> Plugin:
    files = _source_files(top, path)
    dist, version = _owner(top) if path is None else (None, None)
    old = _LOADED.get(top)
    comps = dict(old.components) if old else {}
    for kind, names in added.items():  # one package may hold several plugin modules (entry points)
        comps[kind] = tuple(sorted(set(comps.get(kind, ())) | set(names)))
    if old and source not in old.source.split(", "):  # one package, several entry points
        source = f"{old.source}, {source}"
    plugin = Plugin(top, source, dist, version, source_digest(files), len(files), comps)
    _LOADED[top] = plugin
    return plugin


def load_module(module: str, source: str = "--plugin") -> Plugin:
    """Import a plugin module (dotted name, or a ``.py`` path) and record it; PluginError on any failure."""
    module = str(module).strip()
    path = Path(module) if module.endswith(".py") else None
    if path is not None:
        if not path.is_file():
            raise PluginError(f"plugin {module}: no such file; give an importable module name or a .py path")
        path = path.resolve()
        name = path.stem
    else:
        name = module
    if not name or not all(p.isidentifier() for p in name.split(".")):
        raise PluginError(f"plugin {module!r}: not a module name; give a dotted module name (my_pkg.defense) "
                          "or a .py file path")
    if path is None and name in sys.modules:  # imported already (e.g. by its entry point): nothing new
        top = name.split(".")[0]
        return _LOADED.get(top) or _add(top, source, None, {})
    if path is not None and name in _LOADED and getattr(sys.modules.get(name), "__file__", None) == str(path):
        return _LOADED[name]  # the same file again (a suite loaded twice): nothing new
    added = _import(name, name, path)
    return _add(name.split(".")[0] if path is None else name, source, path, added)


def load_modules(modules: list[str] | tuple[str, ...], relative_to: Path | None = None) -> list[Plugin]:
    """:func:`load_module` for each (``.py`` paths relative to ``relative_to``, e.g. a suite file's folder)."""
    out = []
    for m in modules:
        if relative_to is not None and str(m).endswith(".py") and not Path(m).is_absolute():
            m = str((relative_to / m))
        out.append(load_module(m))
    return out


def discover() -> list[Plugin]:
    """Load every installed entry point of :data:`GROUPS`, once per process.

    A plugin that fails is logged (one line, a warning) and listed by :func:`failures`; the others load,
    so a broken installed plugin does not stop a run that does not use it.
    """
    global _DISCOVERED
    if _DISCOVERED:
        return list(_LOADED.values())
    _DISCOVERED = True
    for group, kind in GROUPS.items():
        for ep in sorted(importlib.metadata.entry_points(group=group), key=lambda e: (e.module, e.name)):
            label = f"{ep.module} (entry point {group}: {ep.name}, a {kind})"
            try:
                if ep.module in sys.modules:
                    _add(ep.module.split(".")[0], f"entry point {group}:{ep.name}", None, {})
                    continue
                added = _import(ep.module, label, None)
                _add(ep.module.split(".")[0], f"entry point {group}:{ep.name}", None, added)
            except PluginError as e:
                _FAILED.append(str(e))
                log.warning("splitinfer: warning: %s", e)
    return list(_LOADED.values())


def loaded() -> list[Plugin]:
    return list(_LOADED.values())


def failures() -> list[str]:
    """The one-line errors of entry points that failed during :func:`discover`."""
    return list(_FAILED)


def records() -> list[dict[str, Any]]:
    """Provenance of every loaded plugin (sorted by name): what ``config.plugins`` holds."""
    return [_LOADED[n].record() for n in sorted(_LOADED)]


def origin(kind: str, name: str) -> str | None:
    """``plugin NAME (dist VERSION)`` when a plugin registered the component, else None (a built-in)."""
    for p in _LOADED.values():
        if name in p.components.get(kind, ()):
            return f"plugin {p.name}" + (f" ({p.dist} {p.version})" if p.dist else "")
    return None


def droppable(kind: str, name: str, error: BaseException) -> str | None:
    """The one-line reason to leave component ``name`` out of a run and go on, or None to let ``error`` stop it.

    Wrong output (:class:`~splitinfer.errors.ComponentError`: shapes, non-finite values) drops any component; any
    other exception drops a plugin's component only (a built-in's is a bug of splitinfer and stops the run).
    """
    from splitinfer.errors import ComponentError

    if isinstance(error, ComponentError):
        return str(error)
    where = origin(kind, name)
    if where is None or not isinstance(error, Exception):
        return None
    return f"{kind} {name!r} ({where}) raised {type(error).__name__}: {error}; fix the plugin, then rerun"


def unload(name: str) -> None:
    """Forget plugin ``name``: its components leave the registries and its modules ``sys.modules`` (a notebook
    can then load an edited version; the tests use it to leave no trace)."""
    plugin = _LOADED.pop(name, None)
    if plugin is None:
        return
    for kind, reg in registries().items():
        for comp in plugin.components.get(kind, ()):
            reg.pop(comp, None)
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]
