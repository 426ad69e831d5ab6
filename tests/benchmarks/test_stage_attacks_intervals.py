"""The attack stage on long documents: >= 10 test documents per corpus, so intervals exist (issue 14 item 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.stage_attacks import stage_attacks
from splitinfer.models import load_model


def test_long_documents_are_capped_so_every_corpus_has_ten_test_documents(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: one long test document took the whole test budget, and the bootstrap over one document gave a
    # zero-width interval such as [64.3, 64.3].
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "long.jsonl"
    words = "the quick brown fox jumps over a lazy dog while seven cats watch".split()
    path.write_text("\n".join(json.dumps({"doc_id": f"d{i}", "text": f"Doc {i}. " + " ".join(
        words[(i + j) % len(words)] for j in range(120))}) for i in range(120)), encoding="utf-8")
    cfg = {"head_depths": [2], "attacks": ["linear-probe"], "corpora": [f"file:{path}"], "train_tokens": 600,
           "test_tokens": 200, "max_length": 64, "options": {"linear-probe": {"epochs": 1, "batch_size": 32}}}
    out = stage_attacks(load_model("tiny-random"), cfg, {"config": {"seed": 0}, "results": {}})
    m = next(r for r in out["rows"] if r["corpus"] == "all")["metrics"]
    assert m["token_f1"]["n"] >= 10
    assert m["token_acc_top1"]["ci_low"] is not None and m["token_acc_top1"]["ci_low"] < m["token_acc_top1"]["ci_high"]
    assert "baseline_position_top1" in m and "coverage" in m and "lift_token_acc_top1" in m
    assert set(out["predictions"]) == {"attacks/linear-probe/head:2"}
