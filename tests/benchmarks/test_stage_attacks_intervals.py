"""The attack stage on long documents: >= 10 test documents per corpus, so intervals exist (issue 14 item 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.stage_attacks import stage_attacks
from splitinfer.models import load_model
from tests.notes_corpus import write_notes


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


def test_the_attack_stage_is_rescored_from_its_predictions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`attack rescore DIR` recomputes every metric of the suite's attack stage from its predictions files and
    finds the results document's figures exactly (issue 14 item 11); a changed figure is reported."""
    from attacks.predictions import rescore_dir, write_all
    from splitinfer.cli import main

    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "notes.jsonl"
    write_notes(path, 40)
    cfg = {"head_depths": [2], "attacks": ["linear-probe"], "corpora": [f"file:{path}"], "train_tokens": 600,
           "test_tokens": 200, "max_length": 32, "options": {"linear-probe": {"epochs": 1, "batch_size": 32}}}
    results = {"config": {"seed": 0}, "results": {}}
    out = stage_attacks(load_model("tiny-random"), cfg, results)
    write_all(out.pop("predictions"), tmp_path / "run")
    doc = {**results, "data": {"attacks": out}}
    (tmp_path / "run" / "results.json").write_text(json.dumps(doc, default=str), encoding="utf-8")
    (rec,) = rescore_dir(tmp_path / "run")
    assert rec["run"] == "attacks/linear-probe/head:2" and rec["metrics"] >= 10 and not rec["mismatches"]
    assert main(["attack", "rescore", str(tmp_path / "run")]) == 0
    doc["results"]["attacks/linear-probe/head:2"]["token_acc_top1"]["ci_low"] = 0.0
    (tmp_path / "run" / "results.json").write_text(json.dumps(doc, default=str), encoding="utf-8")
    assert main(["attack", "rescore", str(tmp_path / "run")]) == 1
