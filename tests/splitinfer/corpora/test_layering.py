"""The runtime reads corpora without importing the attacks package (issue 17 item 1)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RUNTIME_USERS = ["splitinfer/decoding/bridge.py", "splitinfer/decoding/feature_train.py"]


def _imported(path: Path) -> set[str]:
    """Every module an import statement names, at any depth (imports inside functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_corpora_and_their_runtime_users_import_no_higher_layer() -> None:
    files = sorted((ROOT / "splitinfer" / "corpora").glob("*.py")) + [ROOT / p for p in RUNTIME_USERS]
    assert len(files) > len(RUNTIME_USERS)
    for path in files:
        bad = {m for m in _imported(path) if m.split(".")[0] in ("attacks", "benchmarks")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
    assert "splitinfer.corpora" in _imported(ROOT / RUNTIME_USERS[0])
