"""The per-depth inversion study end to end on the tiny model (every attacker, small sizes)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.attacks_depth import StudyConfig, run_study, write_outputs
from benchmarks.attacks_depth_report import markdown
from benchmarks.schema import validate

TINY = {"linear-probe": {"epochs": 2, "batch_size": 32}, "mlp": {"epochs": 1, "width": 32, "batch_size": 32},
        "mlp-seed": {"seed_epochs": 2, "width": 32}, "seq-decoder": {"epochs": 1, "d_model": 32, "layers": 1,
                                                                    "d_ff": 32},
        "output-probe": {"epochs": 2, "batch_size": 32}, "depth-id": {"epochs": 1},
        "vocab-match": {"random_tokens": 256}}


def test_study_on_tiny_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "docs.jsonl"
    docs = [{"doc_id": f"d{i}", "text": f"Dear {n}, your code {i * 7919} is ready. Call 555-01{i:02d}.",
             "pii_spans": [{"start": 5, "end": 5 + len(n), "type": "person"}]}
            for i, n in enumerate(["Ann Lee", "Bob Stone", "Cy Young", "Dee Park", "Eve Moss"] * 8)]
    path.write_text("\n".join(json.dumps(d) for d in docs), encoding="utf-8")
    cfg = StudyConfig(model="tiny-random", head_depths=(1, 2), tail_layers=(2,), corpora=(f"file:{path}",),
                      train_tokens=1500, val_tokens=200, test_tokens=300, max_length=32, vocab_match_tokens=40,
                      hparams=TINY, n_boot=50)
    study = run_study(cfg, progress=False)
    names = {(r["attack"], r["boundary"]) for r in study["rows"]}
    for a in ("linear-probe", "linear-embed", "mlp", "mlp-seed", "seq-decoder", "vocab-match"):
        assert {(a, "head:1"), (a, "head:2")} <= names
    assert {(f"output-probe:{t}", "tail:2") for t in ("next", "current", "both")} <= names
    vm = [r for r in study["rows"] if r["attack"] == "vocab-match"]
    assert all(r["metrics"]["token_acc_top1"]["value"] == 1.0 and r["seconds_per_token"] > 0 for r in vm)
    assert all("pii_recovery_person" in r["metrics"] for r in study["rows"])
    assert len(study["depth_id"]) == 6
    path_json, path_md = write_outputs(study, tmp_path / "out")
    results = json.loads(path_json.read_text())
    validate(results)
    assert "attacks/vocab-match/head:1" in results["results"]
    md = path_md.read_text()
    for heading in ("## Targets", "Token accuracy @1", "seed's MLP protocol", "vocab-match (white-box)", "PII spans",
                    "depth-id", "Output side"):
        assert heading in md, heading


def test_study_resumes_finished_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import attacks_depth

    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"doc_id": f"d{i}", "text": f"Note {i}: the fox jumps {i * 31} times."})
                              for i in range(30)), encoding="utf-8")
    cfg = StudyConfig(model="tiny-random", head_depths=(1,), tail_layers=(), corpora=(f"file:{path}",),
                      train_tokens=600, val_tokens=100, test_tokens=200, max_length=32,
                      attacks=("linear-probe", "linear-embed"), hparams=TINY, n_boot=20)
    partial = tmp_path / "partial.jsonl"
    first = run_study(cfg, progress=False, partial=partial)
    assert len(partial.read_text().splitlines()) == 2
    calls = []
    monkeypatch.setattr(attacks_depth, "make_attack", lambda *a, **k: calls.append(a) or None)
    again = run_study(cfg, progress=False, partial=partial)  # every job is found in the partial file
    assert not calls and [r["metrics"] for r in again["rows"]] == [r["metrics"] for r in first["rows"]]
    fewer = run_study(replace(cfg, attacks=("linear-embed",)), progress=False, partial=partial)
    assert not calls and [r["attack"] for r in fewer["rows"]] == ["linear-embed"]  # the selection is not in the key
    other = {**TINY, "linear-probe": {"epochs": 3, "batch_size": 32}}  # another attack's options: not in this key
    assert run_study(replace(cfg, attacks=("linear-embed",), hparams=other), progress=False, partial=partial)
    assert not calls
    with pytest.raises(AttributeError):  # a changed size is a new study: its jobs run (here: the None stub)
        run_study(replace(cfg, test_tokens=150), progress=False, partial=partial)


def test_vocab_match_only_at_chosen_depths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"doc_id": f"d{i}", "text": f"Note {i}: the fox jumps {i * 31} times."})
                              for i in range(30)), encoding="utf-8")
    cfg = StudyConfig(model="tiny-random", head_depths=(1, 2), tail_layers=(), corpora=(f"file:{path}",),
                      train_tokens=600, val_tokens=100, test_tokens=200, max_length=32, vocab_match_tokens=16,
                      vocab_match_depths=(2,), attacks=("linear-embed", "vocab-match"), hparams=TINY, n_boot=20)
    study = run_study(cfg, progress=False)
    assert sorted((r["attack"], r["boundary"]) for r in study["rows"]) == [
        ("linear-embed", "head:1"), ("linear-embed", "head:2"), ("vocab-match", "head:2")]
    md = markdown(study)
    assert "Not scored in this study (CPU budget): head:1" in md


def test_vocab_match_tries_the_linear_probe_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vocab-match gets the boundary's linear probe as proposer, fitted on demand; its key covers the probe's options."""
    from attacks.recipes.vocab_match import VocabMatch
    from benchmarks.attacks_depth import job_key

    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"doc_id": f"d{i}", "text": f"Note {i}: the fox jumps {i * 31} times."})
                              for i in range(30)), encoding="utf-8")
    cfg = StudyConfig(model="tiny-random", head_depths=(1,), tail_layers=(), corpora=(f"file:{path}",),
                      train_tokens=600, val_tokens=100, test_tokens=200, max_length=32, vocab_match_tokens=16,
                      attacks=("vocab-match",), hparams=TINY, n_boot=20)
    given = []
    real = VocabMatch.set_proposer
    monkeypatch.setattr(VocabMatch, "set_proposer", lambda self, atk: given.append(atk) or real(self, atk))
    study = run_study(cfg, progress=False)  # the linear-probe job is not selected: the probe is fitted for it
    assert [type(a).__name__ for a in given] == ["LinearProbe"] and given[0].fitted
    assert study["rows"][0]["metrics"]["token_acc_top1"]["value"] == 1.0
    other = replace(cfg, hparams={**TINY, "linear-probe": {"epochs": 3, "batch_size": 32}})
    assert job_key(other, "vocab-match") != job_key(cfg, "vocab-match")
    assert job_key(other, "linear-embed") == job_key(cfg, "linear-embed")
