"""The depth study's training seeds, PII sizing and per-token predictions of resumed jobs (issue 14 items 6, 11)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from attacks.predictions import predictions_path, rescore_dir
from benchmarks.attacks_depth import StudyConfig, run_study, to_results, write_outputs
from benchmarks.attacks_depth_report import markdown
from tests.notes_corpus import write_notes

TINY = {"linear-probe": {"epochs": 2, "batch_size": 32},
        "vocab-match": {"random_tokens": 256}}


def _notes(tmp_path: Path, n: int = 30) -> Path:
    return write_notes(tmp_path / "docs.jsonl", n)


def test_learned_attackers_are_fitted_once_per_training_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: one fit per attacker, so nothing showed how much a figure moves with the training seed."""
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    cfg = StudyConfig(model="tiny-random", head_depths=(1,), tail_layers=(), corpora=(f"file:{_notes(tmp_path)}",),
                      train_tokens=600, val_tokens=100, test_tokens=200, max_length=32, vocab_match_tokens=16,
                      attacks=("linear-probe", "vocab-match"), hparams=TINY, train_seeds=(0, 1, 2), n_boot=20)
    study = run_study(cfg, progress=False)
    seeds = sorted((r["attack"], r["train_seed"]) for r in study["rows"])
    assert seeds == [("linear-probe", 0), ("linear-probe", 1), ("linear-probe", 2), ("vocab-match", 0)]  # exact: once
    results = to_results(dict(study))
    runs = results["results"]
    assert {"attacks/linear-probe/head:1/seed-1", "attacks/linear-probe/head:1/seed-2"} <= set(runs)
    values = [r["metrics"]["token_acc_top1"]["value"] for r in study["rows"] if r["attack"] == "linear-probe"]
    assert runs["attacks/linear-probe/head:1"]["top1_seed_mean"]["value"] == pytest.approx(sum(values) / 3)
    assert runs["attacks/linear-probe/head:1"]["top1_seed_min"]["value"] == min(values)
    assert "top1_seed_mean" not in runs["attacks/vocab-match/head:1"]
    md = markdown(study)
    assert "## Attacker training variance" in md and "training seeds 0, 1, 2" in md
    assert "## What changed since the report" in md


def test_resumed_jobs_keep_their_predictions_and_rescore_reproduces_the_results(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: jobs resumed from the partial file wrote no per-token predictions, so the finished study could
    not be rescored. Now each job writes its file as it finishes; a job without one is run again."""
    from benchmarks import attack_grid

    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    cfg = StudyConfig(model="tiny-random", head_depths=(1,), tail_layers=(), corpora=(f"file:{_notes(tmp_path)}",),
                      train_tokens=600, val_tokens=100, test_tokens=200, max_length=32,
                      attacks=("linear-probe", "linear-embed"), hparams=TINY, train_seeds=(0, 1), n_boot=20)
    out = tmp_path / "out"
    partial = out / "partial.jsonl"
    run_study(cfg, progress=False, partial=partial, predictions_dir=out)  # an "interrupted" run: no outputs yet
    files = sorted(p.name for p in (out / "predictions").iterdir())
    assert len(files) == 4 and len(partial.read_text().splitlines()) == 4
    lost = predictions_path(out, "attacks/linear-embed/head:1/seed-1")
    lost.unlink()
    real, calls = attack_grid.make_attack, []
    monkeypatch.setattr(attack_grid, "make_attack", lambda *a, **k: calls.append(a) or real(*a, **k))
    study = run_study(cfg, progress=False, partial=partial, predictions_dir=out)
    assert len(calls) == 1 and lost.is_file() and study["timing"]["resumed_jobs"] == 3
    write_outputs(study, out)
    recs = rescore_dir(out)
    assert len(recs) == 4 and all(r["metrics"] > 10 and not r["mismatches"] and not r["missing"] for r in recs)
    # a changed figure in the results document is caught
    path = out / "attacks_depth.json"
    doc = json.loads(path.read_text())
    doc["results"]["attacks/linear-probe/head:1/seed-1"]["token_acc_top1"]["value"] += 0.01
    path.write_text(json.dumps(doc))
    assert [r["mismatches"] for r in rescore_dir(out) if r["mismatches"]] == [["token_acc_top1"]]


def test_pii_test_split_is_sized_for_every_span_type(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Before: the PII test split had as few as 2 spans of a type (email, IBAN), and the warning about spans
    cut by the document cap was printed at every scoring instead of once per corpus."""
    from benchmarks.attack_grid import GridConfig, extract, plan, run_job
    from splitinfer.models import load_model

    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "pii.jsonl"
    docs = []
    for i in range(600):  # byte-level tiny tokenizer: one token per character
        name, mail, ref = f"Ann Lee{i}", f"ann{i}@example.org", f"#{i:05d} "  # openings differ: none is a duplicate
        text = f"{ref}Dear {name}, write to {mail}. ".ljust(72, "-") + f"{mail} (a copy: it straddles the cap of 80)"
        docs.append({"doc_id": f"d{i}", "text": text, "pii_spans": [
            {"start": len(ref) + 5, "end": len(ref) + 5 + len(name), "type": "person"},
            {"start": text.index(mail), "end": text.index(mail) + len(mail), "type": "email"},
            {"start": text.rindex(mail), "end": text.rindex(mail) + len(mail), "type": "email"}]})
    path.write_text("\n".join(json.dumps(d) for d in docs), encoding="utf-8")
    tiny = load_model("tiny-random")
    cfg = GridConfig(head_depths=(1,), corpora=(f"file:{path}",), attacks=("linear-probe", "linear-embed"),
                     options=TINY, train_tokens=600, test_tokens=100, max_length=64, max_doc_tokens=80,
                     min_pii_spans=40, n_boot=20)
    with caplog.at_level(logging.WARNING):
        data = extract(tiny, cfg)
        for job in plan(cfg, data.depth_of):
            run_job(tiny, cfg, data, job, {})
    pii = data.pii[f"file:{path}"]
    assert pii["spans"]["person"] >= 40 and pii["spans"]["email"] >= 40
    assert pii["test_tokens"] > cfg.test_tokens and pii["unscored_spans"] > 0  # the second email is past the cap
    assert sum("not scored" in r.message for r in caplog.records) == 1  # once per corpus, with the total
    m = run_job(tiny, cfg, data, plan(cfg, data.depth_of)[0], {})[0]["metrics"]
    assert m["pii_recovery_person"]["n"] == pii["spans"]["person"]
