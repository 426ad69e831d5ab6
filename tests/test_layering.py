"""The three layers, read from the source: splitinfer (runtime) -> attacks -> benchmarks, no way back up.

Every import of every module is read with ``ast``, including imports inside functions (the old
command-line cycle ran only through those), and resolved to the module it loads. The test fails on

- any import cycle between modules of the three packages;
- a module of ``splitinfer`` importing ``attacks`` or ``benchmarks``, or one of ``attacks``
  importing ``benchmarks``, except in the modules that compose the layers (:data:`COMPOSERS`: the
  console script and the public API facade ``splitinfer.api``);
- any import of a composer by another module;
- an import of a private name (``from m import _x``) from another module, except a private
  module of the importer's own package (``attacks.recipes._common`` importing ``_backoff``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"splitinfer": 0, "attacks": 1, "benchmarks": 2}
COMPOSER = "splitinfer.cli"
# the modules that compose the three layers: the console script and the public API facade (splitinfer.api imports
# attacks and benchmarks inside its functions only); no library module imports either of them
COMPOSERS = {COMPOSER, "splitinfer.api"}
ALLOWED_UPWARD: set[tuple[str, str]] = set()  # none: the corpora live in splitinfer.corpora


def modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for pkg in LAYERS:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _resolve(name: str, mods: dict) -> str | None:
    """The module ``name`` loads: itself, or the closest package above it that exists."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports(mods: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    """(module -> modules of the three packages it imports anywhere in its body, private-name imports)."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    private = []
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = []
                for a in node.names:
                    full = f"{base}.{a.name}"
                    targets.append(full if full in mods else base)
                    own_private_module = full in mods and base == package
                    if a.name.startswith("_") and _resolve(base, mods) and not own_private_module:
                        private.append(f"{mod} imports {a.name} from {base}")
            else:
                continue
            for t in targets:
                r = _resolve(t, mods) if t.split(".")[0] in LAYERS else None
                if r and r != mod:
                    edges[mod].add(r)
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def upward(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {t}" for m, ts in edges.items() for t in ts
                  if LAYERS[t.split(".")[0]] > LAYERS[m.split(".")[0]] and m not in COMPOSERS
                  and (m, t) not in ALLOWED_UPWARD)


def into_composers(edges: dict[str, set[str]]) -> list[str]:
    """Imports of a composer module by any other module (they sit on top of all three layers)."""
    return sorted(f"{m} -> {t}" for m, ts in edges.items() for t in ts if t in COMPOSERS and m not in COMPOSERS)


def test_the_tree_has_no_cycles_no_upward_imports_and_no_private_reach_ins():
    mods = modules()
    assert {"splitinfer.cli", "attacks.base", "benchmarks.run"} <= set(mods)
    edges, private = imports(mods)
    assert cycles(edges) == []
    assert upward(edges) == []
    assert into_composers(edges) == []
    assert private == []


def test_the_checks_catch_what_they_must(tmp_path: Path):
    """The same checks on a small tree with one of each fault (imports inside functions included)."""
    files = {
        "splitinfer/__init__.py": "",
        "splitinfer/cli.py": "def main():\n    from benchmarks import cli\n",  # the composer: allowed
        "splitinfer/client.py": "def _eos_ids():\n    pass\n",
        "splitinfer/runtime.py": "def f():\n    import attacks.base\n",  # upward, inside a function
        "attacks/__init__.py": "",
        "attacks/base.py": "def load():\n    from attacks.registry import get\n",
        "attacks/registry.py": "from attacks.base import load\nfrom splitinfer.client import _eos_ids\n",
        "attacks/recipes/__init__.py": "",
        "attacks/recipes/_helper.py": "",
        "attacks/recipes/one.py": "from . import _helper\nfrom ..base import load\n",
        "benchmarks/__init__.py": "",
        "benchmarks/cli.py": "from splitinfer import cli\n",  # a cycle through the composer
        "splitinfer/api.py": "def run():\n    from benchmarks import cli\n",  # the facade: allowed
        "attacks/uses_api.py": "def f():\n    from splitinfer import api\n",  # a library module on the facade
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    mods = modules(tmp_path)
    edges, private = imports(mods)
    assert edges["attacks.recipes.one"] == {"attacks.recipes._helper", "attacks.base"}
    assert cycles(edges) == [["attacks.base", "attacks.registry"], ["benchmarks.cli", "splitinfer.cli"]]
    assert upward(edges) == ["splitinfer.runtime -> attacks.base"]
    assert into_composers(edges) == ["attacks.uses_api -> splitinfer.api", "benchmarks.cli -> splitinfer.cli"]
    assert private == ["attacks.registry imports _eos_ids from splitinfer.client"]
