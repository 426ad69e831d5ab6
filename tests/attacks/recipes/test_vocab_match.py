"""vocab-match: exact white-box inversion on tiny-random head states (fp32 and fp16 wire), candidate orders, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from attacks.errors import AttackError
from attacks.recipes.vocab_match import match_distance
from attacks.registry import load_attack, make_attack
from attacks.taps import extract_depths
from tests.attacks.synth import accuracy, make_taps

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Call Ann Lee at 555-0199 about invoice 42.",
         "def f(x):\n    return x * 2\n", "user: hello\nassistant: hi there!", "Zebras zig-zag; quartz vex."]


@pytest.fixture(scope="module")
def taps(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("vm")
    path = root / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"doc_id": f"d{i}", "text": t}) for i, t in enumerate(TEXTS * 4)))
    import os

    old = os.environ.get("SPLITINFER_CACHE")
    os.environ["SPLITINFER_CACHE"] = str(root / "cache")
    try:
        fp32 = extract_depths(tiny, f"file:{path}", ["head:1", "head:2", "head:4"], dtype="fp32", progress=False)
        fp16 = extract_depths(tiny, f"file:{path}", ["head:4"], dtype="fp16", progress=False)
    finally:
        if old is None:
            os.environ.pop("SPLITINFER_CACHE")
        else:
            os.environ["SPLITINFER_CACHE"] = old
    return fp32, fp16


def split(t):
    n = len(t)
    return t.select_sequences(range(n // 2)), t.select_sequences(range(n // 2, n))


def invert_one_without_proposer(tiny, taps, **hparams):
    """(attack, test sequence, inversion): fitted on half of head:2, the first other sequence inverted, no proposer."""
    train, test = split(taps[0]["head:2"])
    test = test.select_sequences([0])
    attack = make_attack("vocab-match", model=tiny, proposer="none", **hparams).fit(train)
    return attack, test, attack.invert(test)


@pytest.mark.parametrize("boundary", ["head:1", "head:2", "head:4"])
def test_vocab_match_recovers_every_token_fp32(tiny, taps, boundary) -> None:
    train, test = split(taps[0][boundary])
    attack = make_attack("vocab-match", model=tiny).fit(train)
    inv = attack.invert(test)
    assert accuracy(inv, test) == 1.0
    assert inv.info["accepted_rate"] == 1.0 and inv.info["seconds_per_token"] > 0
    assert np.all(inv.scores[:, 0] > -attack.hparams["tol"])
    # the tiny model's vocabulary fits in one scan batch: scanning it beats gradient steps (before: 34 gradient
    # searches at head:4, 10 s)
    assert inv.info["gradient_search_rate"] == 0.0


def test_vocab_match_is_robust_to_fp16_wire_rounding(tiny, taps) -> None:
    train, test = split(taps[1]["head:4"])
    inv = make_attack("vocab-match", model=tiny).fit(train).invert(test)
    assert accuracy(inv, test) == 1.0 and inv.info["accepted_rate"] == 1.0


def test_vocab_match_without_proposer_scans_the_vocabulary(tiny, taps) -> None:
    train, test = split(taps[0]["head:2"])
    test = test.select_sequences([0])
    attack = make_attack("vocab-match", model=tiny, proposer="none", batch_sizes=[64], max_batch=128).fit(train)
    inv = attack.invert(test)
    assert accuracy(inv, test) == 1.0 and inv.info["mean_candidates"] > 8


def test_vocab_match_tries_a_learned_attackers_topk_first(tiny, taps) -> None:
    train, test = split(taps[0]["head:2"])
    helper = make_attack("linear-probe", epochs=5, batch_size=32, lr=0.01).fit(train)
    attack = make_attack("vocab-match", model=tiny, proposer="none", batch_sizes=[4]).fit(train)
    attack.set_proposer(helper)
    inv = attack.invert(test)
    assert accuracy(inv, test) == 1.0


def test_vocab_match_round_trip_and_errors(tiny, taps, tmp_path: Path) -> None:
    train, test = split(taps[0]["head:1"])
    attack = make_attack("vocab-match", model=tiny).fit(train)
    path = attack.save(tmp_path / "vm")
    again = load_attack(path, model=tiny)
    assert np.array_equal(again.invert(test).topk, attack.invert(test).topk)
    with pytest.raises(AttackError, match="needs head_weights"):
        load_attack(path).invert(test)
    with pytest.raises(AttackError, match="boundary mismatch"):
        attack.invert(taps[0]["head:2"])
    with pytest.raises(AttackError, match="needs head_weights"):
        make_attack("vocab-match").fit(train)
    with pytest.raises(AttackError, match="model mismatch"):
        make_attack("vocab-match", model=tiny).fit(make_taps(boundary="head:1", d=64))


def test_match_distance_ignores_massive_dimensions() -> None:
    obs = torch.ones(64)
    obs[0] = 1e4  # a massive activation
    near = obs.clone()
    near[0] *= 1 + 1e-3  # fp16-sized error on the huge entry
    far = obs.clone()
    far[1:] = -1.0  # every ordinary dimension differs
    d = match_distance(torch.stack([obs, near, far]), obs)
    assert d[0] == 0 and d[1] < 1e-3 and d[2] > 0.5


def test_gradient_guided_candidates_find_the_token(tiny, taps) -> None:
    """With the proposer's list cut to one candidate, only the SipIt-style gradient search can find the rest."""
    _, test, inv = invert_one_without_proposer(tiny, taps, batch_sizes=[1], max_candidates=1, grad_steps=200)
    assert accuracy(inv, test) == 1.0 and inv.info["gradient_search_rate"] > 0.5


def test_vocab_match_warns_on_one_token_sequences(tiny, taps, caplog) -> None:
    train, test = split(taps[0]["head:2"])
    attack = make_attack("vocab-match", model=tiny, max_candidates=8, grad_steps=0).fit(train)
    with caplog.at_level("WARNING", logger="attacks.recipes.vocab_match"):
        attack.invert(test.select_tokens([1, 2, 3]))
    assert "one-token sequences" in caplog.text


def test_a_capped_miss_does_not_make_the_rest_of_the_sequence_scan_in_vain(tiny, taps) -> None:
    """Behind a position the capped scan missed, the prefix is wrong: later positions must not search further."""
    attack, test, inv = invert_one_without_proposer(tiny, taps, batch_sizes=[2], max_candidates=2, grad_steps=50)
    n = test.n_tokens
    assert inv.info["misses"] >= 1
    first_miss = int(np.argmin(inv.scores[:, 0] > -attack.hparams["tol"]))  # first position not within tol
    assert inv.info["after_miss_rate"] == pytest.approx((n - 1 - first_miss) / n)
    assert inv.info["mean_gradient_steps"] <= 50 * (first_miss + 1) / n  # no gradient search after the miss


def test_an_uncapped_scan_never_misses(tiny, taps) -> None:
    _, _, inv = invert_one_without_proposer(tiny, taps, batch_sizes=[2], grad_steps=0, max_batch=256)
    assert inv.info["misses"] == 0 and inv.info["after_miss_rate"] == 0 and inv.info["accepted_rate"] == 1.0


def test_scoring_subset_spreads_over_documents():
    """Four chunks of one long document gave a one-document sample (no interval): take one chunk per document."""
    import numpy as np
    from attacks.recipes.vocab_match import scoring_subset
    from attacks.tapdata import Taps

    seq_doc = [0, 0, 0, 0, 1, 2, 3]  # document 0 cut into four chunks, then three short documents
    n = 8 * len(seq_doc)
    docs = [{"doc_id": i, "text": "", "pii_spans": []} for i in range(4)]
    taps = Taps(np.zeros((n, 4), np.float32), np.arange(n), np.full(len(seq_doc), 8), seq_doc, docs)
    sub = scoring_subset(taps, {"prose": (0, n)}, per_corpus=16, pii_tokens=0, n_seqs=4)
    assert sorted(set(sub.seq_doc.tolist())) == [0, 1, 2, 3]
    assert sub.n_tokens == 16
    few = scoring_subset(taps.select_sequences([0, 1, 2, 4]), {"prose": (0, 32)}, 16, 0, n_seqs=4)
    assert len(few) == 4 and sorted(set(few.seq_doc.tolist())) == [0, 1]  # fewer documents: filled with chunks


def test_the_candidate_proposer_is_fitted_on_every_corpus_of_the_pool(tiny, taps, monkeypatch) -> None:
    """proposer_tokens smaller than the pool: the proposer's sample spreads over it (it took the pool's first
    sequences, i.e. the first corpus alone, before)."""
    from attacks.recipes.linear_probe import LinearEmbed

    train = taps[0]["head:2"]
    seen = []
    real_fit = LinearEmbed.fit
    monkeypatch.setattr(LinearEmbed, "fit", lambda self, data, val=None, **kw: (seen.append(data), real_fit(
        self, data, val, **kw))[1])
    half = train.n_tokens // 2
    make_attack("vocab-match", model=tiny, proposer_tokens=half, random_tokens=0).fit(train)
    docs = set(seen[0].seq_doc.tolist())
    assert seen[0].n_tokens <= half and max(docs) >= len(train) // 2 and min(docs) < len(train) // 2
