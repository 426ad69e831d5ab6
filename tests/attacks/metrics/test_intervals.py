"""Intervals that mean something (issue 14 item 6): n/a below 2 documents, exact bounds at 0%/100%, paired diffs."""

from __future__ import annotations

import numpy as np
import pytest

from attacks import metrics as M


def test_clopper_pearson_at_the_ends_and_inside() -> None:
    low, high = M.clopper_pearson(332, 332)
    assert high == 1.0 and low == pytest.approx(0.98895, abs=1e-4) and round(100 * low, 1) == 98.9
    assert M.clopper_pearson(0, 50) == (0.0, pytest.approx(1 - 0.025 ** (1 / 50)))
    low, high = M.clopper_pearson(5, 10)  # textbook value: [0.187, 0.813]
    assert low == pytest.approx(0.1871, abs=1e-3) and high == pytest.approx(0.8129, abs=1e-3)
    with pytest.raises(ValueError, match="successes <= trials"):
        M.clopper_pearson(3, 2)


def test_interval_is_na_with_one_document() -> None:
    assert M.interval([9], [14], binary=True) == (9 / 14, None, None)
    assert M.interval([9, 0], [14, 0], binary=True) == (9 / 14, None, None)  # an empty document does not count


def test_interval_uses_exact_bounds_over_documents_when_every_token_is_right() -> None:
    value, low, high = M.interval([100, 232], [100, 232], binary=True)  # 332 tokens, but only 2 documents
    assert value == 1.0 and high == 1.0 and low == pytest.approx(0.025 ** 0.5)  # 15.8%, not 98.9% over tokens
    assert M.bootstrap_ci([100, 232], [100, 232], n_boot=50)[1] == 1.0  # what the bootstrap alone would give
    value, low, high = M.interval([0, 0, 0], [5, 5, 5], binary=True)
    assert value == 0.0 and low == 0.0 and high == pytest.approx(1 - 0.025 ** (1 / 3))
    # issue 28: 64 of 64 tokens over 4 documents is [39.8, 100], not the token-level [94.4, 100]
    assert tuple(round(100 * x, 1) for x in M.interval([16] * 4, [16] * 4, binary=True)) == (100.0, 39.8, 100.0)
    assert M.document_extremes(20) == (pytest.approx(0.8316, abs=1e-4), pytest.approx(0.1684, abs=1e-4))
    value, low, high = M.interval([1.0, 1.0, 1.0], [1, 1, 1], binary=False)  # per-document scores (F1) all 1
    assert (low, high) == (pytest.approx(0.025 ** (1 / 3)), 1.0)


def test_interval_is_never_narrower_than_possible_issue_28() -> None:
    """The issue's own figures: each was printed by the old rule and is impossible."""
    # 87.5 [87.5, 87.5]: every one of 4 documents at 14/16, the bootstrap has nothing to resample
    value, low, high = M.interval([14, 14, 14, 14], [16] * 4, binary=True)
    assert value == 0.875 and low < 0.875 < high
    assert high >= M.clopper_pearson(56, 64)[1] and low <= M.document_extremes(4)[0]
    # 63/64 got [95.3, 100], tighter than 64/64's exact bound: no outcome may be more certain than all-right
    value, low, high = M.interval([16, 16, 16, 15], [16] * 4, binary=True)
    all_right = M.interval([16] * 4, [16] * 4, binary=True)
    assert low <= all_right[1] and high == 1.0
    # 2/16 got [0.0, 25.0]; the exact binomial interval is about [1.6, 38.3], and 0/16 over 4 documents reaches 60.2
    value, low, high = M.interval([1, 1, 0, 0], [4] * 4, binary=True)
    cp = M.clopper_pearson(2, 16)
    assert (round(100 * cp[0], 1), round(100 * cp[1], 1)) == (1.6, 38.3)
    assert low <= cp[0] and high >= cp[1] and high >= M.interval([0] * 4, [4] * 4, binary=True)[2]


def test_interval_with_many_documents_is_the_bootstrap() -> None:
    """60 documents, ~2,000 tokens, documents of different difficulty: the floors do not bind, the bootstrap is reported."""
    rng = np.random.default_rng(0)
    den = rng.integers(20, 50, size=60)
    num = rng.binomial(den, rng.uniform(0.2, 0.8, size=60))
    assert M.interval(num, den, binary=True) == M.bootstrap_ci(num, den)


@pytest.mark.parametrize("docs", [2, 4, 20, 60])
def test_interval_lower_bound_is_monotone_in_successes(docs) -> None:
    """One more wrong token never raises the lower bound (the 63/64 versus 64/64 inversion of issue 28)."""
    per = 16
    lows = []
    for wrong in range(0, 4):
        num = np.full(docs, per)
        num[:wrong] -= 1
        lows.append(M.interval(num, np.full(docs, per), binary=True)[1])
    assert all(a >= b for a, b in zip(lows, lows[1:])), lows


def test_interval_bootstraps_otherwise() -> None:
    num, den = np.array([3, 5, 8, 1]), np.array([10, 10, 10, 10])
    value, low, high = M.interval(num, den, binary=True, seed=3)
    _, b_low, b_high = M.bootstrap_ci(num, den, seed=3)
    cp = M.clopper_pearson(17, 40)
    assert value == 17 / 40 and low == min(b_low, cp[0]) and high == max(b_high, cp[1], M.document_extremes(4)[1])


def test_paired_bootstrap_diff_keeps_the_pairing() -> None:
    rng = np.random.default_rng(0)
    den = rng.integers(20, 60, size=40)
    hard = rng.uniform(0.1, 0.9, size=40)  # per-document difficulty shared by both attackers
    a = np.round(den * hard).astype(int)
    b = np.maximum(a - 2, 0)  # b is slightly but consistently worse
    diff, low, high = M.paired_bootstrap_diff(a, den, b, den, n_boot=500)
    assert diff > 0 and low > 0  # significant when paired
    _, la, ha = M.bootstrap_ci(a, den, n_boot=500)
    _, lb, hb = M.bootstrap_ci(b, den, n_boot=500)
    assert la < hb  # ... although the two unpaired intervals overlap
    same = M.paired_bootstrap_diff(a, den, a, den, n_boot=100)
    assert same == (0.0, 0.0, 0.0)
    assert M.paired_bootstrap_diff([1], [2], [0], [2]) == (0.5, None, None)
    with pytest.raises(ValueError, match="same documents"):
        M.paired_bootstrap_diff([1, 2], [2, 2], [1], [2])


def test_paired_token_diff_pairs_tokens_by_document() -> None:
    rng = np.random.default_rng(1)
    doc = np.repeat(np.arange(30), 10)  # 30 documents of 10 tokens
    a = rng.random(300) < np.repeat(rng.uniform(0.2, 0.9, 30), 10)
    b = a.copy()
    b[::7] = False  # b loses a few of a's tokens
    diff, low, high = M.paired_token_diff(doc, a, b, n_boot=400)
    assert diff == pytest.approx(a.mean() - b.mean()) and 0 < low <= diff <= high
    per_a = np.bincount(doc, weights=a)
    per_b = np.bincount(doc, weights=b)
    boot = M.paired_bootstrap_diff(per_a, np.full(30, 10.0), per_b, np.full(30, 10.0), n_boot=400)
    assert diff == boot[0] and low <= boot[1] and high >= boot[2]
    shuffled = rng.permutation(300)  # document ids need not be sorted or contiguous
    assert M.paired_token_diff(doc[shuffled] * 3 + 5, a[shuffled], b[shuffled], n_boot=400) == (diff, low, high)
    with pytest.raises(ValueError, match="same tokens"):
        M.paired_token_diff(doc, a, b[:-1])


def test_paired_token_diff_is_never_narrower_than_the_discordant_tokens_allow():
    """4 documents in which A gets one token of 4 more than B: the bootstrap alone says +25.0 [+25.0, +25.0]."""
    doc = np.repeat(np.arange(4), 4)
    a = np.ones(16, bool)
    b = np.tile([True, True, True, False], 4)
    diff, low, high = M.paired_token_diff(doc, a, b)
    assert M.paired_bootstrap_diff([4] * 4, [4] * 4, [3] * 4, [4] * 4) == (0.25, 0.25, 0.25)
    assert diff == 0.25 and high == pytest.approx(0.25) and low == pytest.approx(0.25 * (2 * 0.025 ** 0.25 - 1))
    assert low < 0  # 4 of 4 discordant tokens: not significant (two-sided sign test p = 0.125)
    many = M.paired_token_diff(np.repeat(np.arange(40), 4), np.ones(160, bool), np.tile(b, 10))
    assert many[1] > 0  # 40 of 40 discordant tokens over 40 documents: significant
    assert M.paired_token_diff(doc, a, a) == (0.0, 0.0, 0.0)  # no discordant token: the bootstrap's zero


def test_summarize_reports_document_level_bounds_issue_28():
    """The defense tables' numbers come from summarize: 4 documents of 16 tokens, every token recovered, print
    [39.8, 100.0] (not the token-level [94.4, 100.0]); 14 of 16 in each document is no longer [87.5, 87.5]."""
    trues = [np.arange(16) + 100 * i for i in range(4)]
    right = M.summarize(trues, [t[:, None] for t in trues], ks=(1,))["token_acc_top1"]
    assert (right["value"], round(100 * right["ci_low"], 1), right["ci_high"], right["n"]) == (1.0, 39.8, 1.0, 64)
    guesses = [np.where(np.arange(16) < 14, t, -1)[:, None] for t in trues]
    m = M.summarize(trues, guesses, ks=(1,))["token_acc_top1"]
    assert m["value"] == 0.875 and m["ci_low"] < 0.875 < m["ci_high"]
