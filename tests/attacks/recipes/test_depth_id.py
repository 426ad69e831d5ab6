"""depth-id: identify the split depth from activations (stats + logistic regression, raw MLP)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attacks.errors import AttackError
from attacks.registry import load_attack, make_attack
from attacks.taps import extract_depths
from tests.attacks.synth import make_taps


def synthetic_depths(seed: int):
    return [make_taps(n_seqs=20, seed=seed, boundary=f"head:{d}", scale=s, first_doc=100 * seed)
            for d, s in ((1, 1.0), (2, 3.0), (4, 9.0))]


def test_depth_id_on_synthetic_scales(tmp_path) -> None:
    attack = make_attack("depth-id", epochs=6, batch_size=32).fit(synthetic_depths(0))
    assert attack.meta["depths"] == [1, 2, 4]
    for t in synthetic_depths(1):
        depth = t.meta["depth"]
        for clf in ("stats", "raw"):
            pred = attack.identify(t, classifier=clf)
            assert (pred["sequence_depth"] == depth).mean() == 1.0
            assert (pred["token_depth"] == depth).mean() > (0.9 if clf == "stats" else 0.6)
    t = synthetic_depths(1)[1]
    acc = attack.accuracy(t, "stats")
    assert acc["depth"] == 2 and acc["sequence_acc"] == 1.0 and acc["n_tokens"] == t.n_tokens
    again = load_attack(attack.save(tmp_path / "did"))
    assert np.array_equal(again.identify(t)["token_depth"], attack.identify(t)["token_depth"])
    assert np.allclose(again.token_logp(t, "stats"), attack.token_logp(t, "stats"))


def test_depth_id_is_its_own_interface() -> None:
    """Regression (issue 17 item 6): depth-id used to be an InversionAttack whose fit took another argument type."""
    from attacks.base import DepthIdentifier, InversionAttack

    attack = make_attack("depth-id")
    assert isinstance(attack, DepthIdentifier) and not isinstance(attack, InversionAttack)
    assert not hasattr(attack, "invert")


def test_depth_id_on_tiny_model_states(tiny, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "docs.jsonl"
    texts = [f"Document {i}: the quick brown fox number {i * 37} jumps over {i % 7} lazy dogs." for i in range(24)]
    path.write_text("\n".join(json.dumps({"doc_id": f"d{i}", "text": t}) for i, t in enumerate(texts)))
    taps = extract_depths(tiny, f"file:{path}", ["head:1", "head:2", "head:4"], progress=False)
    train = [t.select_sequences(range(16)) for t in taps.values()]
    test = [t.select_sequences(range(16, 24)) for t in taps.values()]
    attack = make_attack("depth-id", epochs=4, batch_size=32).fit(train)
    for t in test:
        assert (attack.identify(t, classifier="stats")["sequence_depth"] == t.meta["depth"]).mean() >= 0.75


def test_depth_id_needs_several_depths() -> None:
    with pytest.raises(AttackError, match="two or more distinct"):
        make_attack("depth-id").fit([make_taps()])
    with pytest.raises(AttackError, match="classifier"):
        make_attack("depth-id", classifier="forest")
