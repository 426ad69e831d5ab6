"""The seed-protocol replica: 16 documents, token-position vs document splits, report with the git state."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks.paper_replica import ReplicaConfig, document_split, run_replica, summarize, token_split, write
from benchmarks.paper_replica_docs import DOCS


def test_docs_are_the_seed_genre_mix() -> None:
    genres = [g for g, _ in DOCS]
    assert len(DOCS) == 16 and genres.count("code") == 2 and genres.count("chat") == 2
    assert {"general", "medical", "legal", "http", "finance", "sql", "science", "pangram", "climate"} <= set(genres)


def test_splits_partition_and_differ_by_seed() -> None:
    tr, te = token_split(1100, 0.2, 0)
    assert len(te) == 220 and not set(tr) & set(te) and len(tr) + len(te) == 1100
    assert not np.array_equal(token_split(1100, 0.2, 1)[1], te)
    dtr, dte = document_split(16, 0.2, 3)
    assert len(dte) == 3 and sorted(np.concatenate([dtr, dte]).tolist()) == list(range(16))


def test_replica_on_tiny_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    cfg = replace(ReplicaConfig(), model="tiny-random", head_depths=(1, 2), splits=2, epochs=1, width=32)
    calls = []
    result = run_replica(cfg, on_split=lambda partial: calls.append((partial["config"]["splits_done"],
                                                                     len(partial["runs"]))))
    assert calls == [(1, 4), (2, 8)]  # the report is rewritten after each split, every depth covered
    assert len(result["runs"]) == 2 * 2 * 2
    assert {r["protocol"] for r in result["runs"]} == {"seed (token positions)", "held-out documents"}
    seed_runs = [r for r in result["runs"] if r["protocol"].startswith("seed")]
    assert all(r["test_tokens"] == round(0.2 * result["config"]["tokens"]) for r in seed_runs)
    rows = summarize(result)
    assert len(rows) == 4 and all(r["splits"] == 2 and r["min"] <= r["mean"] <= r["max"] for r in rows)
    path_json, path_md = write(result, tmp_path / "out")
    doc = json.loads(path_json.read_text())
    assert "git_hash" in doc and "git_dirty" in doc and len(doc["summary"]) == 4
    assert "held-out documents" in path_md.read_text()
