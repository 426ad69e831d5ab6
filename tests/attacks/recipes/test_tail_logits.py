"""tail-logits: the public tail + LM head on returned states recover the model's own next-token choice exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from attacks.errors import AttackError
from attacks.registry import get_attack_class, load_attack, make_attack
from attacks.taps import extract_depths
from tests.notes_corpus import write_notes


@pytest.fixture
def corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "docs.jsonl"
    write_notes(path, 6)
    return f"file:{path}"


def test_tail_logits_equals_the_full_models_argmax(tiny, corpus: str, tmp_path: Path) -> None:
    taps = extract_depths(tiny, corpus, ["tail:2"], dtype="fp32", progress=False)["tail:2"]
    attack = make_attack("tail-logits", model=tiny).fit(taps)
    inv = attack.invert(taps, k=3)
    want = []
    for _, rows in taps.sequences():
        with torch.no_grad():
            logits = tiny.model(torch.from_numpy(taps.token_ids[rows])[None]).logits[0]  # (T, V)
        want.append(logits.argmax(-1).numpy())
    assert np.array_equal(inv.tokens, np.concatenate(want))
    assert get_attack_class("tail-logits").threat_model == "white-box (exact)" and attack.reads == "next"
    again = load_attack(attack.save(tmp_path / "tl"), model=tiny)
    assert np.array_equal(again.invert(taps, k=3).topk, inv.topk)


def test_tail_logits_needs_the_model_and_tail_taps(tiny, corpus: str) -> None:
    taps = extract_depths(tiny, corpus, ["tail:2", "head:2"], progress=False)
    with pytest.raises(AttackError, match="needs lm_head, tail_weights"):
        make_attack("tail-logits").fit(taps["tail:2"])
    with pytest.raises(AttackError, match="tail boundary"):
        make_attack("tail-logits", model=tiny).fit(taps["head:2"])
