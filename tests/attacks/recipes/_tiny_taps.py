"""Shared tiny-model head taps for the matching-attack tests (text variants, fp32, head:2)."""

from __future__ import annotations

import json
import os

from attacks.taps import extract_depths
from tests.attacks.recipes.test_vocab_match import TEXTS


def tiny_head_taps(tiny, root, dtype: str = "fp32"):
    """Head-2 taps of four variants of each test text (20 sequences, one document each)."""
    path = root / "docs.jsonl"
    texts = [f"{t} ({k})" for k in range(4) for t in TEXTS]
    path.write_text("\n".join(json.dumps({"doc_id": f"d{i}", "text": t}) for i, t in enumerate(texts)))
    os.environ.setdefault("SPLITINFER_CACHE", str(root / "cache"))
    return extract_depths(tiny, f"file:{path}", ["head:2"], dtype=dtype, progress=False)["head:2"]
