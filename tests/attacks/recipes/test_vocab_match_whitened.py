"""vocab-match-whitened: Mahalanobis matching beats Euclidean matching under anisotropic noise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attacks.errors import AttackError
from attacks.recipes.vocab_match_whitened import precision_factor, whitened_sq
from attacks.registry import make_attack
from attacks.tapdata import Taps
from tests.attacks.recipes._tiny_taps import tiny_head_taps


@pytest.fixture(scope="module")
def taps(tiny, tmp_path_factory):
    return tiny_head_taps(tiny, tmp_path_factory.mktemp("vmw"))


def _anisotropic(taps: Taps, seed: int) -> Taps:
    """Noise of std 8 on the first 16 dimensions and 0.2 on the other 48 (states have norms ~19 here)."""
    scales = np.r_[np.full(16, 8.0), np.full(taps.hidden_size - 16, 0.2)].astype(np.float32)
    noise = np.random.default_rng(seed).normal(size=taps.hidden.shape).astype(np.float32) * scales
    return Taps(np.asarray(taps.hidden, np.float32) + noise, taps.token_ids, taps.seq_lengths, taps.seq_doc,
                taps.documents, taps.offsets, taps.meta)


def test_precision_factor_whitens():
    rng = np.random.default_rng(0)
    scales = torch.tensor([4.0, 1.0, 0.25])
    r = torch.from_numpy(rng.normal(size=(20000, 3))).float() * scales  # (N, 3)
    for kind in ("full", "diagonal"):
        f = precision_factor(r, kind, 0.0)
        assert whitened_sq(r, f).mean().item() == pytest.approx(3.0, rel=0.05)  # chi-square with 3 dof
    iso = precision_factor(r, "isotropic", 0.0)
    assert torch.allclose(iso, iso[0].expand(3))


def test_mahalanobis_beats_euclidean_under_anisotropic_noise(tiny, taps):
    train, test = _anisotropic(taps, 1), _anisotropic(taps.select_sequences(range(2)), 2)  # own draws vs victim's
    got = {}
    for cov in ("isotropic", "diagonal", "full"):
        atk = make_attack("vocab-match-whitened", model=tiny, covariance=cov, beam=1, proposer_tokens=2000,
                          random_tokens=512).fit(train)
        got[cov] = float((atk.invert(test, k=1).tokens == test.token_ids).mean())
    print("top-1 by covariance", got)
    assert got["diagonal"] > 0.95 and got["full"] > 0.95, got
    assert got["isotropic"] < 0.6, got  # Euclidean (isotropic at the mean variance)
    assert atk.fit_report["residuals"] == taps.n_tokens


def test_bad_covariance_is_an_attack_error():
    with pytest.raises(AttackError, match="covariance='spherical'"):
        make_attack("vocab-match-whitened", covariance="spherical")
