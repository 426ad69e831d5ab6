"""A grid cell on hand-made predictions: the strongest attacker on the common set, paired gaps over documents."""

from __future__ import annotations

import numpy as np

from attacks.base import Inversion
from attacks.metrics.baselines import TokenPrior
from attacks.evaluate import paired_gap
from benchmarks.grid_cell import gaps_to_strongest, score_on_set, strongest
from tests.attacks.synth import make_taps


def _scored(taps, right: np.ndarray) -> dict:
    """An attacker that gets exactly the tokens flagged in ``right`` (others: a wrong id)."""
    guess = np.where(right, taps.token_ids, (taps.token_ids + 1) % 40)
    inv = Inversion(guess, np.stack([guess] * 5, 1), np.zeros((taps.n_tokens, 5), np.float32), {})
    prior = TokenPrior.fit(taps.token_ids, taps.positions())
    return score_on_set(inv, taps, vocab=40, prior=prior, n_boot=200, seed=0, meta={})[0]


def test_the_strongest_is_the_maximum_on_the_common_set_and_others_show_their_paired_gap() -> None:
    taps = make_taps(n_seqs=12, seq_len=10)
    rng = np.random.default_rng(0)
    a = {"attack": "a", **_scored(taps, rng.random(taps.n_tokens) < 0.9)}
    b = {"attack": "b", **_scored(taps, rng.random(taps.n_tokens) < 0.5)}
    paired = {"attack": "b+paired", "k": 100, **_scored(taps, np.ones(taps.n_tokens, bool))}
    tried = [b, a, paired]
    best = strongest(tried)
    assert best is a  # paired attackers are another threat model: never the cell's recovery
    assert all(x["metrics"]["token_acc_top1"]["n"] == taps.n_tokens for x in tried)  # one set for all
    gaps_to_strongest(tried, best, n_boot=200)
    gap = b["gap_to_best"]
    want = a["metrics"]["token_acc_top1"]["value"] - b["metrics"]["token_acc_top1"]["value"]
    assert abs(gap["value"] - want) < 1e-12 and gap["n"] == 12 and gap["ci_low"] > 0  # a clear lead
    assert a["gap_to_best"] is None


def test_paired_gap_uses_shared_documents_only() -> None:
    taps = make_taps(n_seqs=6, seq_len=8)
    a = _scored(taps, np.ones(taps.n_tokens, bool))
    b = _scored(taps, np.zeros(taps.n_tokens, bool))
    b["doc_top1"] = {k: v[:3] for k, v in b["doc_top1"].items()}  # b scored on 3 of the 6 documents
    gap = paired_gap(a, b, n_boot=100)
    assert gap["n"] == 3 and gap["value"] == 1.0
    assert paired_gap(a, {"doc_top1": None}) is None


def test_the_undefended_gap_is_computed_from_the_rows_so_shards_merge_alike() -> None:
    from benchmarks.grid_cell import with_undefended_gaps

    taps = make_taps(n_seqs=8, seq_len=6)
    clean = {"top1": None, **_scored(taps, np.ones(taps.n_tokens, bool))}
    noisy = {"top1": None, **_scored(taps, np.arange(taps.n_tokens) % 2 == 0)}
    rows = [{"depth": 2, "family": "noise", "best": noisy}, {"depth": 2, "family": "none", "best": clean},
            {"depth": 8, "family": "noise", "best": noisy}]
    got = with_undefended_gaps(rows)
    assert got[0]["vs_undefended"]["value"] == -0.5 and got[0]["vs_undefended"]["ci_high"] < 0
    assert got[1]["vs_undefended"]["value"] == 0.0 and got[2]["vs_undefended"] is None  # no undefended row at 8
    assert "vs_undefended" not in rows[0]  # copies
