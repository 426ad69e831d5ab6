"""What a ``noise`` setting means in absolute terms: noise norm, signal-to-noise ratio, composed epsilon.

Issue 28 (findings 6 and 7). ``noise(sigma, clip)`` adds N(0, (sigma*C)^2) per coordinate to each state
clipped to L2 norm C (:mod:`splitinfer.defenses.noise`); sigma is a multiple of the clip norm *per
coordinate*, so over d coordinates the noise vector's norm is about ``sigma * C * sqrt(d)`` (24 sigma C at
d = 576: sigma = 0.05 is 1.2x the clip norm). This module gives, for one setting:

* :func:`expected_noise_norm` -- E||N(0, s^2 I_d)|| = s * sqrt(2) * Gamma((d+1)/2) / Gamma(d/2), about s sqrt(d);
* :func:`signal_to_noise` -- ||signal|| / E||noise|| with the signal at its largest, the clip norm C (with C
  the median state norm, half the states sit exactly there): ``1 / (sigma sqrt(d))`` roughly;
* :func:`composed_epsilon` -- (epsilon, delta) of ``k`` releases composed with opacus's RDP accountant
  (Mironov, "Renyi Differential Privacy", CSF 2017; Abadi et al., "Deep Learning with Differential
  Privacy", CCS 2016, for the accountant), each release the Gaussian mechanism with L2 sensitivity 2C
  (one vector replaced by any other) and noise std sigma*C, i.e. noise multiplier sigma / 2;
* :func:`noise_accounting` -- all of it for one setting, for a prompt of ``prompt_tokens`` vectors and a
  generation releasing ``generation_tokens`` vectors; :func:`protection_words` says in words whether the
  epsilon protects anything.

Composing over a prompt's T vectors bounds what the cloud learns about the *whole prompt* replaced by any other
of the same length (every vector may change when one token does, since later states depend on it). Under
speculative decoding rejected draft states are further releases, so the generation figure (sequential
decoding) is a lower bound on the epsilon spent. None of these figures is a guarantee that text stays
private: above :data:`MEANINGLESS_EPSILON` (10) an (epsilon, delta) bound allows the cloud's odds on any
hypothesis about the text to change by a factor e^10 ~ 22,000, which protects nothing.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

__all__ = ["MEANINGLESS_EPSILON", "NoiseAccounting", "composed_epsilon", "expected_noise_norm", "noise_accounting",
           "protection_words", "signal_to_noise"]

#: the line drawn in the reports: an epsilon above it "gives no meaningful protection"
MEANINGLESS_EPSILON = 10.0

_ORDERS = tuple([1 + x / 100.0 for x in range(1, 100)] + [2 + x / 10.0 for x in range(90)] + list(range(12, 64))
                + [128, 256, 512, 1024, 4096])


def expected_noise_norm(std: float, d: int) -> float:
    """E||z|| for z ~ N(0, std^2 I_d) (the chi distribution's mean times std); about ``std * sqrt(d)``."""
    if d < 1 or std < 0:
        raise ValueError(f"expected_noise_norm needs d >= 1 and std >= 0, got d={d}, std={std}")
    return float(std * math.sqrt(2.0) * math.exp(math.lgamma((d + 1) / 2.0) - math.lgamma(d / 2.0)))


def signal_to_noise(sigma: float, clip: float, d: int, signal_norm: float | None = None) -> float:
    """||signal|| / E||noise|| of one released vector; the signal's norm defaults to the clip norm (its largest)."""
    noise = expected_noise_norm(sigma * clip, d)
    signal = clip if signal_norm is None else min(float(signal_norm), clip)
    return math.inf if noise == 0 else signal / noise


@functools.lru_cache(maxsize=1024)
def composed_epsilon(sigma: float, releases: int, delta: float = 1e-5) -> float:
    """epsilon at ``delta`` of ``releases`` Gaussian releases, each with noise multiplier ``sigma / 2`` (RDP).

    Sampling rate 1 (every release happens); sensitivity 2C per release (one vector replaced by any other),
    noise std sigma*C. ``releases = 1`` is :meth:`splitinfer.defenses.noise.Noise.epsilon`.
    """
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    if releases < 1:
        raise ValueError(f"composed_epsilon needs releases >= 1, got {releases}")
    if not 0 < delta < 1:
        raise ValueError(f"composed_epsilon needs delta in (0, 1), got {delta}")
    if sigma <= 0:
        return math.inf
    rdp = compute_rdp(q=1.0, noise_multiplier=sigma / 2.0, steps=int(releases), orders=list(_ORDERS))
    with warnings.catch_warnings():  # "optimal order is the smallest/largest alpha": far from useful settings
        warnings.simplefilter("ignore")
        eps, _ = get_privacy_spent(orders=list(_ORDERS), rdp=rdp, delta=delta)
    return float(eps)


def protection_words(epsilon: float) -> str:
    """The row's verdict in words, with the line drawn at :data:`MEANINGLESS_EPSILON`."""
    if not epsilon <= MEANINGLESS_EPSILON:
        return f"no meaningful protection (epsilon > {MEANINGLESS_EPSILON:g})"
    return f"epsilon <= {MEANINGLESS_EPSILON:g}: a formal bound, not evidence that text stays hidden"


@dataclass(frozen=True)
class NoiseAccounting:
    """One noise setting in absolute terms (module docstring for each figure)."""

    sigma: float  # noise std per coordinate, as a multiple of the clip norm C
    clip: float  # C
    d: int  # hidden size: coordinates per released vector
    noise_norm: float  # E||noise|| ~ sigma * C * sqrt(d)
    noise_norm_over_clip: float  # noise_norm / C ~ sigma * sqrt(d)
    snr: float  # ||signal|| / E||noise||, signal norm C
    delta: float
    eps_vector: float  # one released vector
    prompt_tokens: int
    eps_prompt: float  # the prompt's vectors composed
    generation_tokens: int
    eps_generation: float  # prompt + generated vectors composed (sequential decoding; a lower bound under drafts)
    verdict: str  # protection_words of the prompt's epsilon


def noise_accounting(sigma: float, clip: float, d: int, *, delta: float = 1e-5, prompt_tokens: int = 128,
                     generated_tokens: int = 128) -> NoiseAccounting:
    """Every figure of one noise setting, for a prompt of ``prompt_tokens`` and a generation of that many more."""
    if prompt_tokens < 1 or generated_tokens < 0:
        raise ValueError(f"prompt_tokens must be >= 1 and generated_tokens >= 0, got {prompt_tokens}, "
                         f"{generated_tokens}")
    norm = expected_noise_norm(sigma * clip, d)
    gen = prompt_tokens + generated_tokens
    eps_prompt = composed_epsilon(sigma, prompt_tokens, delta)
    return NoiseAccounting(sigma=sigma, clip=clip, d=d, noise_norm=norm, noise_norm_over_clip=norm / clip,
                           snr=signal_to_noise(sigma, clip, d), delta=delta,
                           eps_vector=composed_epsilon(sigma, 1, delta), prompt_tokens=prompt_tokens,
                           eps_prompt=eps_prompt, generation_tokens=gen,
                           eps_generation=composed_epsilon(sigma, gen, delta), verdict=protection_words(eps_prompt))
