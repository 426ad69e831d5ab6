"""The issue-29 defenses in the defenses stage on the tiny model: calibrated profiles, the denoiser's utility,
and lora-adv scored by fresh attackers on its fixed outputs, never by the adversary it trained with."""

from __future__ import annotations

from pathlib import Path

import pytest

import splitinfer.defenses.lora_adv as lora_adv
from benchmarks.stage_defenses import stage_defenses
from splitinfer.defenses import DefenseError
from splitinfer.models import load_model
from tests.notes_corpus import write_notes


@pytest.fixture()
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPLITINFER_PROFILES", str(tmp_path / "profiles"))
    path = tmp_path / "docs.jsonl"
    write_notes(path, 40)
    return {"head_depths": [2], "tail_layers": 1, "corpora": [f"file:{path}"], "train_tokens": 600,
            "test_tokens": 160, "max_length": 32, "utility_positions": 60, "greedy_prompts": 2, "tokens": 4,
            "scored_set": {"user_tokens": 8, "docs_per_corpus": 8, "min_tokens": 0, "min_documents": 0},
            "categories": ["conversational"],
            "defenses": ["pclip(sigma=0.2,percentile=90.0)+denoise", "shaped-noise(sigma=0.2,percentile=90.0)",
                         "lora-adv(rank=2,steps=3,weight=1.0)"],
            "attackers": ["linear-probe"], "options": {"linear-probe": {"epochs": 2}}}


def test_new_defenses_in_the_stage(cfg: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list = []

    class Recording(lora_adv.Adversary):  # keep the training adversary to prove it never scores
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(lora_adv, "Adversary", Recording)
    trained: list[Path] = []
    real_train = lora_adv.train_adversarial_adapter

    def keep_dir(*a, **k):
        path = real_train(*a, **k)
        trained.append(Path(path))
        return path

    checks: list = []
    real_check = lora_adv.check_fresh

    def record_check(attacker, adapter_dir):
        checks.append(attacker)
        with pytest.raises(DefenseError, match="the adversary it was trained against"):
            real_check(made[0].linear, adapter_dir)  # the training adversary is refused
        return real_check(attacker, adapter_dir)

    monkeypatch.setattr(lora_adv, "train_adversarial_adapter", keep_dir)
    monkeypatch.setattr("benchmarks.defenses_adv.check_fresh", record_check)
    results = {"config": {"seed": 0}, "results": {}}
    out = stage_defenses(load_model("tiny-random"), cfg, results)
    rows = {r["defense"].split("(")[0]: r for r in out["rows"]}
    assert set(rows) == {"pclip", "shaped-noise", "lora-adv"}
    assert "profile=" in rows["pclip"]["defense"] and "denoise(" in rows["pclip"]["defense"]
    assert "profile=" in rows["shaped-noise"]["defense"]
    adv = rows["lora-adv"]
    names = {a["attack"]: a for a in adv["attackers"]}
    assert names["linear-probe"]["threat_model"] == "shadow, adaptive"  # public-weights attacker
    fresh = names["linear-probe+adapter-disclosed"]
    assert fresh["threat_model"] == "white-box (learned), adaptive"
    assert len(made) == 1 and len(checks) == 1 and checks[0] is not made[0].linear
    assert adv["best"]["attack"] in names
    assert all(f"defenses/head:2/{r['defense']}" in results["results"] for r in rows.values())
