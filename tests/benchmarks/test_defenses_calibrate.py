"""defenses_calibrate: the learned denoiser is fitted on public text in the form the runtime sends it."""

from __future__ import annotations

from pathlib import Path

import pytest

import benchmarks.defenses_calibrate as dc
from attacks.boundary import Boundary
from benchmarks.defense_utility import chat_form_sequences
from benchmarks.scored_set import ScoredSetConfig
from benchmarks.stage_defenses import grid_data, spec_pipeline
from splitinfer.tokens import public_opening, public_prefix_length
from tests.notes_corpus import write_notes


@pytest.fixture()
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPLITINFER_PROFILES", str(tmp_path / "profiles"))
    path = tmp_path / "docs.jsonl"
    write_notes(path, 60)
    return {"corpora": [f"file:{path}"], "train_tokens": 600, "test_tokens": 160, "max_length": 32,
            "scored_set": {"user_tokens": 8, "docs_per_corpus": 8, "min_tokens": 0, "min_documents": 0}}


def test_the_denoiser_trains_on_chat_form_training_text(tiny, cfg: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its pairs come from training-split documents in chat form (the runtime's public opening first), never
    from the held-out utility sequences; the plain-text taps it used before left it costing agreement."""
    loaded = tiny
    _, data = grid_data(loaded, cfg, [2], 0, ScoredSetConfig.from_suite(cfg))
    train = data.train[Boundary("head", 2)]
    seen: list = []
    real = dc.denoiser_pairs

    def record(model, depth, body_end, noise, seqs, **kw):
        seen.append((list(map(list, seqs)), kw["public"]))
        return real(model, depth, body_end, noise, seqs, **kw)

    monkeypatch.setattr(dc, "denoiser_pairs", record)
    pipe = dc.calibrate(loaded, spec_pipeline("pclip(sigma=0.2,percentile=90.0)+denoise", train), 2, 1, train, 0,
                        cfg["corpora"], cfg["max_length"])
    assert "denoise(mode=learned,profile=" in pipe.label
    (seqs, public), = seen
    opening = len(public_opening(loaded.tokenizer))
    assert 0 < len(seqs) <= dc.DENOISER_SEQUENCES
    assert all(public_prefix_length(loaded.tokenizer, s) == opening for s in seqs)  # chat form, opening first
    assert public == [opening] * len(seqs)
    held = {tuple(s) for s in chat_form_sequences(loaded, cfg["corpora"], 60, cfg["max_length"], 0)}
    assert not held & {tuple(s) for s in seqs}
