"""Output-side attackers are scored on real split generation (wire taps, speculative drafts included)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from attacks.boundary import Boundary
from benchmarks.attack_grid import GridConfig, extract, plan, run_job
from benchmarks.attack_wire import next_token_targets


def _tail_logits_grid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny):
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"doc_id": f"d{i}", "text": f"Note {i}: the fox jumps {i * 31} times over "
                                          "the fox."}) for i in range(40)), encoding="utf-8")
    cfg = GridConfig(head_depths=(), tail_layers=(2,), corpora=(f"file:{path}",), attacks=("tail-logits",),
                     train_tokens=300, test_tokens=300, max_length=32, wire_tokens=64)
    data = extract(tiny, cfg)
    return cfg, data


def test_tail_logits_recovers_generated_tokens_from_wire_traffic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 tiny) -> None:
    cfg, data = _tail_logits_grid(tmp_path, monkeypatch, tiny)
    target = next_token_targets(tiny, cfg, data, Boundary("tail", 2))
    assert target.scored_on == "wire" and len(target.rows) == 64  # every generated token, none of the prompt
    assert target.traffic["wire_draft_frames"] > 0 and target.traffic["wire_rejected_rows"] > 0  # drafts on the wire
    sent_next = target.taps.next_token_ids()[target.rows]  # the generated token, when it was sent back afterwards
    has = sent_next >= 0
    assert has.sum() == 64 - len(target.taps) and np.array_equal(target.truth.token_ids[has], sent_next[has])
    (job,) = plan(cfg, data.depth_of)
    row = run_job(tiny, cfg, data, job, {})[0]
    assert row["scored_on"] == "wire" and row["leaks"] == "output" and row["test_tokens"] == 64
    assert row["metrics"]["token_acc_top1"]["value"] == 1.0  # greedy output: the public tail gives it exactly
    assert next_token_targets(tiny, cfg, data, Boundary("tail", 2)) is target  # generated once per grid and boundary


def test_skipped_wire_sessions_are_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny) -> None:
    """Before: a session whose committed rows were not the generated stream was dropped with a log line only; the
    results and the report did not say how many."""
    from benchmarks import attack_wire
    from benchmarks.schema import new_results

    cfg, data = _tail_logits_grid(tmp_path, monkeypatch, tiny)
    real = attack_wire._session_rows

    def drop_first_row_of_one_session(steps):
        sessions = real(steps)
        first = next(iter(sessions))
        sessions[first] = sessions[first][1:]  # positions no longer 0, 1, 2, ...: not the generated stream
        return sessions

    monkeypatch.setattr(attack_wire, "_session_rows", drop_first_row_of_one_session)
    (job,) = plan(cfg, data.depth_of)
    row = run_job(tiny, cfg, data, job, {})[0]
    assert row["info"]["wire_skipped_sessions"] == 1 and row["info"]["wire_sessions"] >= 2
    results = new_results({"model": "tiny-random"}, "test")
    attack_wire.record_traffic(results, "attacks/tail-logits/tail:2", row["info"])
    assert results["results"]["attacks/tail-logits/tail:2"]["wire_skipped_sessions"]["value"] == 1
    assert "1 skipped" in attack_wire.traffic_line([row])
