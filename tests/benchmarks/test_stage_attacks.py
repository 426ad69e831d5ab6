"""The suite's attack stage on the tiny model: vocab-match is scored on whole sequence prefixes."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.stage_attacks import stage_attacks
from splitinfer.models import load_model
from tests.notes_corpus import write_notes


def test_vocab_match_in_the_suite_recovers_every_scored_token(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: the stage used to score vocab-match on single token rows (each its own one-token sequence at
    # position 0, without its prefix), so matching failed past the first token and fell back to full-vocabulary
    # scans. It must be scored on prefixes of whole sequences.
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "docs.jsonl"
    write_notes(path, 40)
    cfg = {"head_depths": [2], "attacks": ["linear-probe", "vocab-match"], "corpora": [f"file:{path}"],
           "train_tokens": 600, "test_tokens": 200, "max_length": 32,
           "options": {"linear-probe": {"epochs": 1, "batch_size": 32},
                       "vocab-match": {"scored_tokens": 40, "random_tokens": 256, "grad_steps": 0}}}
    results = {"config": {"seed": 0}, "results": {}}
    out = stage_attacks(load_model("tiny-random"), cfg, results)
    vm = next(r for r in out["rows"] if r["attack"] == "vocab-match")
    assert vm["test_tokens"] >= 20  # prefixes of up to 4 sequences x 10 tokens
    assert vm["metrics"]["token_acc_top1"]["value"] == 1.0
    assert vm["info"]["accepted_rate"] == 1.0
    assert cfg["options"]["vocab-match"]["scored_tokens"] == 40  # the suite's own config is not consumed


def test_no_shadow_result_without_a_privately_changed_victim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 14 item 4: learned attackers trained on public-model pairs against the published weights were labelled
    shadow; they are white-box (learned), and a shadow row needs a victim with private local layers."""
    from attacks.errors import AttackError
    from benchmarks.attack_grid import Victim, check_row, row_threat_model

    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "docs.jsonl"
    write_notes(path, 40)
    cfg = {"head_depths": [2], "tail_depths": [2], "attacks": ["linear-probe", "output-probe", "tail-logits"],
           "corpora": [f"file:{path}"], "train_tokens": 600, "test_tokens": 200, "max_length": 32, "wire_tokens": 16,
           "options": {"linear-probe": {"epochs": 1, "batch_size": 32}, "output-probe": {"epochs": 1}}}
    results = {"config": {"seed": 0}, "results": {}}
    out = stage_attacks(load_model("tiny-random"), cfg, results)
    labels = {(r["attack"], r["threat_model"]) for r in out["rows"]}
    assert labels == {("linear-probe", "white-box (learned)"), ("output-probe", "white-box (learned)"),
                      ("tail-logits", "white-box (exact)")}
    assert "no result is shadow" in out["note"]
    wire = [r for r in out["rows"] if r["attack"] == "tail-logits" and r["corpus"] == "all"]
    assert wire[0]["scored_on"] == "wire" and 0 < wire[0]["test_tokens"] <= 16
    assert "attacks/tail-logits/tail:2" in results["results"]
    assert row_threat_model("white-box (learned)", Victim("lora-random", private_local_layers=True)) == "shadow"
    with pytest.raises(AttackError, match="labelled shadow but the victim"):
        check_row({"attack": "mlp", "boundary": "head:2", "threat_model": "shadow"}, Victim())
