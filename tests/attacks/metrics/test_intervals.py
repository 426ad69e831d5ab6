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


def test_interval_uses_exact_bounds_when_every_token_is_right() -> None:
    value, low, high = M.interval([100, 232], [100, 232], binary=True)
    assert value == 1.0 and high == 1.0 and low == pytest.approx(0.98895, abs=1e-4)
    assert M.bootstrap_ci([100, 232], [100, 232], n_boot=50)[1] == 1.0  # what the bootstrap alone would give
    value, low, high = M.interval([0, 0, 0], [5, 5, 5], binary=True)
    assert value == 0.0 and low == 0.0 and high > 0.0


def test_interval_bootstraps_otherwise() -> None:
    num, den = np.array([3, 5, 8, 1]), np.array([10, 10, 10, 10])
    assert M.interval(num, den, binary=True, seed=3) == M.bootstrap_ci(num, den, seed=3)


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
