"""The learned-attacker ablation (benchmarks/attacks_learned.py) end to end on the tiny model, small sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.attacks_depth import StudyConfig
from benchmarks.attacks_learned import AblationConfig, main, rows, run_ablation, write_outputs
from benchmarks.schema import load

TINY = {"linear-probe": {"epochs": 2, "batch_size": 32}, "seq-decoder": {"epochs": 1, "d_model": 32, "layers": 1,
                                                                        "d_ff": 32, "probe_epochs": 1}}


def test_ablation_rows_scores_and_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"doc_id": f"d{i}", "text": f"Order {i * 7919} ships to {n} on day {i}."})
                              for i, n in enumerate(["Ann", "Bob", "Cy", "Dee", "Eve"] * 8)), encoding="utf-8")
    study = StudyConfig(model="tiny-random", corpora=(f"file:{path}",), train_tokens=400, val_tokens=150,
                        test_tokens=300, max_length=32, hparams=TINY, n_boot=50)
    cfg = AblationConfig(model="tiny-random", depth=2, scales=(1, 2), long={"epochs": 2, "freeze_skip": False},
                         candidates=4, beam=2, lams=(0.5,), study=study)
    labels = [r.label for r in rows(cfg)]
    assert len(labels) == 9 and labels[0].startswith("probe baseline") and "output=tied" in labels[3]
    ab = run_ablation(cfg)
    assert [r["label"] for r in ab["rows"]] == labels
    assert all(r["threat_model"] == "white-box (learned)" for r in ab["rows"])
    assert ab["config"]["sizes"][2]["train_tokens"] > ab["config"]["sizes"][1]["train_tokens"]
    beam = [r for r in ab["rows"] if r["name"] == "lm-beam"]
    assert len(beam) == 2 and all(r["base_candidates_topk"]["value"] >= r["base_top1"]["value"] for r in beam)
    assert ab["rows"][3]["info"]["output"] == "tied" and "coverage" in ab["rows"][3]["metrics"]
    assert ab["rows"][3]["train_tokens"] == ab["rows"][0]["train_tokens"]  # the tied head's pair is row 1
    assert beam[0]["options"]["linear-probe"]["output"] == "tied"  # the beam over the full-vocabulary probe
    json_path, md_path = write_outputs(ab, tmp_path / "out", "python -m benchmarks.attacks_learned --out X")
    results = load(json_path)
    assert results["suite"] == "attacks-learned" and len(results["rows"]) == 9
    text = md_path.read_text(encoding="utf-8")
    assert "Goal: the best learned attacker" in text and "Data curve, linear-probe" in text


def test_bad_scales_are_one_line_errors(capsys: pytest.CaptureFixture) -> None:
    assert main(["--out", "x", "--scales", "0,4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --scales") and err.count("\n") == 1
