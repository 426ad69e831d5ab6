"""Noise in absolute terms (issue 28, findings 6 and 7): noise norm, SNR, epsilon composed over a prompt."""

from __future__ import annotations

import math

import pytest
import torch

from splitinfer.defenses.noise import Noise
from splitinfer.defenses.noise_accounting import (MEANINGLESS_EPSILON, composed_epsilon, expected_noise_norm,
                                                  noise_accounting, protection_words, signal_to_noise)


def test_the_noise_norm_is_about_sigma_c_sqrt_d():
    """The issue's figures: about 24 sigma C at d = 576, so sigma = 0.05 is 1.2x the clip norm."""
    assert expected_noise_norm(1.0, 576) == pytest.approx(24.0, rel=1e-3)
    acc = noise_accounting(0.05, 66.55, 576)
    assert acc.noise_norm_over_clip == pytest.approx(1.2, abs=0.01) and acc.noise_norm == pytest.approx(79.8, abs=0.1)
    assert acc.snr == pytest.approx(1 / 1.2, abs=0.01)
    z = torch.randn(20000, 64, generator=torch.Generator().manual_seed(0)) * 3.0
    assert expected_noise_norm(3.0, 64) == pytest.approx(float(z.norm(dim=1).mean()), rel=5e-3)  # chi mean


def test_signal_to_noise_uses_the_clip_norm_at_most():
    assert signal_to_noise(0.1, 10.0, 100) == pytest.approx(10.0 / expected_noise_norm(1.0, 100))
    assert signal_to_noise(0.1, 10.0, 100, signal_norm=50.0) == signal_to_noise(0.1, 10.0, 100)  # clipped to C
    assert signal_to_noise(0.1, 10.0, 100, signal_norm=5.0) == pytest.approx(signal_to_noise(0.1, 10.0, 100) / 2)
    assert signal_to_noise(0.0, 10.0, 100) == math.inf


def test_one_release_is_the_defenses_own_epsilon():
    for sigma in (0.25, 1.0, 4.0):
        assert composed_epsilon(sigma, 1) == pytest.approx(Noise(sigma=sigma, clip=3.0).epsilon(), rel=1e-9)


def test_composing_k_gaussian_releases_is_one_release_with_sqrt_k_less_noise():
    """Renyi DP of the Gaussian mechanism adds up exactly: k releases at multiplier z = one at z / sqrt(k)."""
    for sigma, k in ((4.0, 16), (20.0, 128), (1.0, 4)):
        assert composed_epsilon(sigma, k) == pytest.approx(composed_epsilon(sigma / math.sqrt(k), 1), rel=1e-6)
    eps = [composed_epsilon(8.0, k) for k in (1, 2, 8, 128, 256)]
    assert eps == sorted(eps) and eps[-1] > eps[-2]
    assert composed_epsilon(0.0, 5) == math.inf


def test_a_prompt_and_a_generation_compose_their_vectors():
    acc = noise_accounting(20.0, 1.0, 576, prompt_tokens=128, generated_tokens=128)
    assert acc.eps_prompt == pytest.approx(composed_epsilon(20.0, 128)) and acc.generation_tokens == 256
    assert acc.eps_vector < acc.eps_prompt < acc.eps_generation
    assert acc.eps_prompt < MEANINGLESS_EPSILON and "not evidence" in acc.verdict
    # the quick grid's noise levels protect nothing even per vector, let alone per prompt
    worst = noise_accounting(0.25, 67.31, 576)
    assert worst.eps_vector > MEANINGLESS_EPSILON and worst.verdict.startswith("no meaningful protection")


def test_protection_words_draw_the_line_at_ten():
    assert protection_words(10.0).startswith("epsilon <= 10")
    assert protection_words(10.01) == "no meaningful protection (epsilon > 10)"
    assert protection_words(math.inf).startswith("no meaningful protection")


@pytest.mark.parametrize("kwargs", [{"prompt_tokens": 0}, {"generated_tokens": -1}])
def test_bad_lengths_are_refused(kwargs):
    with pytest.raises(ValueError, match="prompt_tokens"):
        noise_accounting(1.0, 1.0, 8, **kwargs)
