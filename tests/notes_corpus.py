"""A small corpus file for tests: numbered one-line notes, each its own document (a ``file:`` corpus)."""
from __future__ import annotations

import json
from pathlib import Path


def write_notes(path: Path, n: int) -> Path:
    """Write ``n`` notes as ``{"doc_id", "text"}`` JSON lines to ``path``; return the path."""
    path.write_text("\n".join(json.dumps({"doc_id": f"d{i}", "text": f"Note {i}: the fox jumps {i * 31} times."})
                              for i in range(n)), encoding="utf-8")
    return path
