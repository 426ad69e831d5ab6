"""The per-depth inversion study end to end on the tiny model (every attacker, small sizes)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from attacks.boundary import Boundary
from benchmarks.attacks_depth import StudyConfig, run_study, write_outputs
from benchmarks.attacks_depth_report import markdown
from benchmarks.schema import validate
from tests.notes_corpus import write_notes

TINY = {"linear-probe": {"epochs": 2, "batch_size": 32}, "mlp": {"epochs": 1, "width": 32, "batch_size": 32},
        "mlp-seed": {"seed_epochs": 2, "width": 32}, "seq-decoder": {"epochs": 1, "d_model": 32, "layers": 1,
                                                                    "d_ff": 32},
        "output-probe": {"epochs": 2, "batch_size": 32}, "output-probe:current": {"epochs": 2, "batch_size": 32},
        "depth-id": {"epochs": 1},
        "vocab-match": {"random_tokens": 256}}


def test_study_on_tiny_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "docs.jsonl"
    # each opens with its own number: the scored set skips sequences whose opening repeats a training one
    docs = [{"doc_id": f"d{i}", "text": f"#{i:02d} {n}, your code {i * 7919} is ready. Call 555-01{i:02d}.",
             "pii_spans": [{"start": 4, "end": 4 + len(n), "type": "person"}]}
            for i, n in enumerate(["Ann Lee", "Bob Stone", "Cy Young", "Dee Park", "Eve Moss"] * 8)]
    path.write_text("\n".join(json.dumps(d) for d in docs), encoding="utf-8")
    cfg = StudyConfig(model="tiny-random", head_depths=(1, 2), tail_layers=(2,), corpora=(f"file:{path}",),
                      train_tokens=1500, val_tokens=200, test_tokens=300, max_length=32, vocab_match_tokens=40,
                      wire_tokens=24, hparams=TINY, train_seeds=(0,), min_pii_spans=0, n_boot=50)
    study = run_study(cfg, progress=False)
    names = {(r["attack"], r["boundary"]) for r in study["rows"]}
    for a in ("linear-probe", "linear-embed", "mlp", "mlp-seed", "seq-decoder", "vocab-match"):
        assert {(a, "head:1"), (a, "head:2")} <= names
    assert {("output-probe", "tail:2"), ("output-probe:current", "tail:2"), ("tail-logits", "tail:2")} <= names
    assert not any(a.endswith(":both") or a.endswith(":next") for a, _ in names)
    by = {(r["attack"], r["boundary"]): r for r in study["rows"]}
    # output side: scored on the generated tokens of real split generation; :current is input-side leakage
    assert by[("output-probe", "tail:2")]["scored_on"] == "wire" and by[("output-probe", "tail:2")]["leaks"] == "output"
    assert by[("output-probe:current", "tail:2")]["leaks"] == "input"
    wl = by[("tail-logits", "tail:2")]
    assert wl["threat_model"] == "white-box (exact)" and wl["metrics"]["token_acc_top1"]["value"] >= 0.9
    assert 0 < wl["test_tokens"] <= 24
    # issue 14 item 4: every victim runs the published weights, so no row is shadow
    assert {r["threat_model"] for r in study["rows"]} == {"white-box (exact)", "white-box (learned)"}
    vm = [r for r in study["rows"] if r["attack"] == "vocab-match"]
    assert all(r["metrics"]["token_acc_top1"]["value"] == 1.0 and r["seconds_per_token"] > 0 for r in vm)
    assert all("pii_recovery_person" in r["metrics"] for r in study["rows"] if r["scored_on"] == "teacher-forced")
    assert len(study["depth_id"]) == 6
    path_json, path_md = write_outputs(study, tmp_path / "out")
    results = json.loads(path_json.read_text())
    validate(results)
    assert "attacks/vocab-match/head:1" in results["results"]
    md = path_md.read_text()
    for heading in ("## Targets", "Token accuracy @1", "seed's MLP protocol", "vocab-match (white-box, exact)",
                    "PII spans", "depth-id", "Output side", "Input side read from the states the body returns"):
        assert heading in md, heading


def test_study_resumes_finished_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import attack_grid

    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "docs.jsonl"
    write_notes(path, 30)
    cfg = StudyConfig(model="tiny-random", head_depths=(1,), tail_layers=(), corpora=(f"file:{path}",),
                      train_tokens=600, val_tokens=100, test_tokens=200, max_length=32,
                      attacks=("linear-probe", "linear-embed"), hparams=TINY, train_seeds=(0,), n_boot=20)
    partial = tmp_path / "partial.jsonl"
    first = run_study(cfg, progress=False, partial=partial)
    assert len(partial.read_text().splitlines()) == 2
    calls = []
    monkeypatch.setattr(attack_grid, "make_attack", lambda *a, **k: calls.append(a) or None)
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
    write_notes(path, 30)
    cfg = StudyConfig(model="tiny-random", head_depths=(1, 2), tail_layers=(), corpora=(f"file:{path}",),
                      train_tokens=600, val_tokens=100, test_tokens=200, max_length=32, vocab_match_tokens=16,
                      vocab_match_depths=(2,), attacks=("linear-embed", "vocab-match"), hparams=TINY, train_seeds=(0,), n_boot=20)
    study = run_study(cfg, progress=False)
    assert sorted((r["attack"], r["boundary"]) for r in study["rows"]) == [
        ("linear-embed", "head:1"), ("linear-embed", "head:2"), ("vocab-match", "head:2")]
    md = markdown(study)
    assert "Not scored in this study (CPU budget): head:1" in md


def test_vocab_match_tries_the_linear_probe_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vocab-match gets the boundary's linear probe as proposer, fitted on demand; its key covers the probe's
    options."""
    from attacks.recipes.vocab_match import VocabMatch
    from benchmarks.attack_grid import Job, extract, job_key
    from benchmarks.attacks_depth import grid_config
    from splitinfer.models import load_model

    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "docs.jsonl"
    write_notes(path, 30)
    cfg = StudyConfig(model="tiny-random", head_depths=(1,), tail_layers=(), corpora=(f"file:{path}",),
                      train_tokens=600, val_tokens=100, test_tokens=200, max_length=32, vocab_match_tokens=16,
                      attacks=("vocab-match",), hparams=TINY, train_seeds=(0,), n_boot=20)
    given = []
    real = VocabMatch.set_proposer
    monkeypatch.setattr(VocabMatch, "set_proposer", lambda self, atk: given.append(atk) or real(self, atk))
    study = run_study(cfg, progress=False)  # the linear-probe job is not selected: the probe is fitted for it
    assert [type(a).__name__ for a in given] == ["LinearProbe"] and given[0].fitted
    assert study["rows"][0]["metrics"]["token_acc_top1"]["value"] == 1.0
    tiny = load_model("tiny-random")
    data = extract(tiny, grid_config(cfg))
    other = grid_config(replace(cfg, hparams={**TINY, "linear-probe": {"epochs": 3, "batch_size": 32}}))
    vm, le = Job("vocab-match", "vocab-match", {}, Boundary("head", 1), 1), Job("linear-embed", "linear-embed", {}, Boundary("head", 1), 1)
    assert job_key(other, vm, data, tiny.sha256) != job_key(grid_config(cfg), vm, data, tiny.sha256)
    assert job_key(other, le, data, tiny.sha256) == job_key(grid_config(cfg), le, data, tiny.sha256)


def test_resume_key_covers_data_model_and_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 14 item 8: the key held neither the data, nor the model sha256, nor the code; a rerun after changing
    any of them reused stale rows."""
    from benchmarks import attack_grid
    from benchmarks.attack_grid import Job, extract, job_key
    from benchmarks.attacks_depth import grid_config
    from splitinfer.models import load_model

    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    tiny = load_model("tiny-random")

    def data_of(word: str):
        path = tmp_path / f"{word}.jsonl"
        path.write_text("\n".join(json.dumps({"doc_id": f"d{i}", "text": f"Note {i}: the {word} jumps {i * 31}."})
                                  for i in range(30)), encoding="utf-8")
        cfg = StudyConfig(model="tiny-random", head_depths=(1,), tail_layers=(), corpora=("file:corpus.jsonl",),
                          train_tokens=300, val_tokens=0, test_tokens=100, max_length=32, hparams=TINY)
        grid = grid_config(cfg)
        return grid, extract(tiny, replace(grid, corpora=(f"file:{path}",)))

    job = Job("linear-probe", "linear-probe", {}, Boundary("head", 1), 1)
    grid, fox = data_of("fox")
    _, cat = data_of("cat")  # same sizes and config, other text
    key = job_key(grid, job, fox, tiny.sha256)
    assert key == job_key(grid, job, fox, tiny.sha256)
    assert key != job_key(grid, job, cat, tiny.sha256)
    assert key != job_key(grid, job, fox, "0" * 64)
    changed = tmp_path / "trainer_copy.py"
    changed.write_text("# another trainer\n", encoding="utf-8")
    monkeypatch.setattr(attack_grid, "SOURCES", attack_grid.SOURCES + (str(changed),))
    with_file = job_key(grid, job, fox, tiny.sha256)
    changed.write_text("# another trainer, edited\n", encoding="utf-8")
    assert with_file != key and job_key(grid, job, fox, tiny.sha256) != with_file
