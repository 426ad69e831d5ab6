"""attacks.recipes._align on hand-made states: each step of the weight-free basis estimate recovers what it should."""

from __future__ import annotations

import torch

from attacks.recipes._align import (eigen_init, fit_weights, mutual_neighbours, procrustes, relative_residual,
                                    signed_init, snap_signed)
from splitinfer.defenses.permute import basis


def _states(n: int, d: int = 24, tokens: int = 40, seed: int = 0) -> torch.Tensor:
    """(n, d) float64 clustered states: ``tokens`` fixed centres with distinct per-dimension scales, small context
    noise (a shallow layer's states sit near their token's)."""
    scale = torch.linspace(0.5, 6.0, d, dtype=torch.float64)  # anisotropic: the second moments have gaps
    centres = torch.randn(tokens, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * scale
    centres += 0.3 * scale  # the same vocabulary for every sample; ``seed`` draws which tokens appear
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, tokens, (n,), generator=gen)
    return centres[ids] + 0.05 * torch.randn(n, d, generator=gen, dtype=torch.float64)


def test_procrustes_recovers_a_rotation_from_exact_pairs():
    q = basis("rotation", 5, 24)
    h = _states(200)
    assert torch.allclose(procrustes(h, h @ q), q, atol=1e-9)


def test_snap_signed_finds_the_nearest_signed_permutation():
    q = basis("signed", 5, 24)
    noisy = q + 0.2 * torch.randn(24, 24, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert torch.equal(snap_signed(noisy), q)


def test_signed_init_reads_a_signed_permutation_off_the_statistics():
    q = basis("signed", 7, 24)
    public, released = _states(4000, seed=1), _states(4000, seed=2) @ q  # different samples, same distribution
    got = signed_init(public, released)
    assert float((got * q).sum()) / 24 > 0.9  # measured: every dimension and sign right


def test_signed_init_from_one_anchor_alone_when_its_magnitudes_are_distinct():
    q = basis("signed", 7, 24)
    anchor = torch.linspace(1.0, 3.0, 24, dtype=torch.float64)[None] * torch.tensor([1.0, -1.0] * 12)  # (1, d)
    flat = torch.ones(10, 24, dtype=torch.float64)  # statistics that say nothing
    assert torch.equal(signed_init(flat, flat @ q, anchor, anchor @ q), q)


def test_eigen_init_recovers_a_rotation_when_the_second_moments_are_exact():
    """Same states on both sides (no sampling error) and a spectrum with gaps: the eigenvectors pin Q, the mean
    and one anchor its signs."""
    q = basis("rotation", 3, 24)
    h = _states(4000, seed=1)
    assert torch.allclose(eigen_init(h, h @ q, h[:1], h[:1] @ q), q, atol=1e-6)


def test_mutual_neighbours_pair_each_point_with_its_own_copy():
    a = _states(50, seed=4)
    i, j = mutual_neighbours(a, torch.cat([a[25:], a[:25]]))  # the same points, reordered
    assert torch.equal(j, (i + 25) % 50)


def test_fit_weights_leave_out_the_rows_a_wrong_token_decoded():
    q = basis("rotation", 3, 24)
    h = _states(100)
    y = h @ q
    wrong = h.clone()
    wrong[::4] = _states(25, seed=9)  # a quarter decoded wrongly
    w = fit_weights(wrong, y, q, quantile=0.1)
    assert w[::4].sum() == 0 and w.sum() == 75
    assert relative_residual(h, y, q).max() < 1e-12
