"""``noise``: per-token L2 clipping then Gaussian noise on the states that leave the local side.

The Gaussian mechanism (Dwork and Roth, "The Algorithmic Foundations of
Differential Privacy", 2014, sec. 3.5) applied per released vector: each
state h (d,) the head sends is clipped to ``||h|| <= clip`` and released as
``h + N(0, (sigma * clip)^2 I)``. Neighbouring relation: one released vector
replaced by any other, so the L2 sensitivity is ``2 * clip`` and the noise
multiplier is ``sigma * clip / (2 * clip) = sigma / 2``. (epsilon, delta) come
from opacus's RDP accountant (Mironov, "Renyi Differential Privacy", CSF
2017) for one release at sampling rate 1. This is a guarantee **per released
vector, not per token of text**: a token also moves every later position's
state, and every released vector of a prompt depends on it.

Draws are keyed by (seed, session, absolute position, direction) and, on the
local side, a digest of the token path ending at that position
(:mod:`splitinfer.defenses.keyed`), so speculative and sequential decoding
release identical vectors. Deviation from the issue's key: without the path
digest, a speculative step's sibling draft nodes (same position, different
tokens) would carry the *same* noise, and their released differences would be
noise-free; with it, a vector is re-released with the same noise only when it is
the same state (a replay), which leaks nothing new. The session in the key gives text resent in a new
session fresh draws, which an observer who links the sessions can average; ``per_session=false`` leaves the
session out of the key, so a resent token path gets its old draws again (``reports/resend``).
``replies=true`` also noises the states the body returns, with the cloud's own draws (it then must know: the hello carries it);
that cannot hide anything from the cloud, which computed them, only from
whoever sees the wire or its logs, and it costs utility.

The public opening (an added BOS, the chat template's first tokens: the
cloud knows them without seeing user text, and by causal attention their
states depend on nothing else) is released untouched, neither clipped nor
noised, when the caller passes the public mask (``public``; the runtime and
the attack harness both do): the clip's utility cost came mostly from
clipping position 0's attention-sink state (``reports/clip_ablation``), and
noising a state the cloud can compute itself hides nothing. A public token
after user text (the marker closing a turn) has attended to that text, so
it is clipped and noised like any other (:func:`keep_public`).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from splitinfer.defenses.base import Defense, DefenseError, register_defense
from splitinfer.defenses.keyed import draw_session, keyed_normal
from splitinfer.tokens import leading_public


@functools.lru_cache(maxsize=256)
def gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    """(epsilon at delta) of one Gaussian release with std = noise_multiplier * sensitivity (opacus RDP)."""
    from opacus.accountants import RDPAccountant

    if noise_multiplier <= 0:
        return float("inf")
    acc = RDPAccountant()
    acc.step(noise_multiplier=noise_multiplier, sample_rate=1.0)
    orders = [1 + x / 100.0 for x in range(1, 100)] + [2 + x / 10.0 for x in range(90)] + list(range(12, 64))
    with warnings.catch_warnings():  # "optimal order is the smallest alpha": only at multipliers far below 0.1
        warnings.simplefilter("ignore")
        return float(acc.get_epsilon(delta=delta, alphas=orders + [128, 256, 512, 1024, 4096]))


def clip_rows(x: torch.Tensor, clip: float | torch.Tensor) -> torch.Tensor:
    """(T, d) -> (T, d) with every row's L2 norm at most ``clip`` (a scalar, or (T, 1) one per row)."""
    norms = x.norm(dim=-1, keepdim=True)  # (T, 1)
    return x * torch.clamp(clip / (norms + 1e-12), max=1.0)


def keep_public(released: torch.Tensor, original: torch.Tensor, public: Sequence[bool] | None) -> torch.Tensor:
    """(T, d) released rows with the leading run of ``public`` rows put back to ``original`` (None: none).

    ``public`` (T,) marks the rows of a sequence from position 0 whose tokens the cloud knows (an added BOS, the
    chat template's opening). Only the run before the first user token goes back untouched
    (:func:`splitinfer.tokens.leading_public`): a later public token's state has attended to user text."""
    n = leading_public(public)
    if not n:
        return released
    return torch.cat([original[:n].to(released.dtype), released[n:]])


@register_defense("noise")
@dataclass(frozen=True)
class Noise(Defense):
    """Clip each state to L2 norm ``clip``, add N(0, (sigma*clip)^2) per coordinate."""

    sigma: float = 0.05
    clip: float = 8.0
    replies: bool = False
    per_session: bool = True  # false: a resent token path gets the same draw in every session (keyed.draw_session)
    seed: int = 0
    delta: float = 1e-5

    kind = "wire"
    strength = ("sigma",)
    secret = ("seed",)
    shown = ("clip",)
    uses_public = True  # the pipeline passes the public-position mask

    def validate(self) -> None:
        # inf would release inf/NaN states and report a finite epsilon for an infinite sensitivity
        if math.isinf(self.sigma):
            raise DefenseError(f"noise: sigma={self.sigma} must be finite and >= 0; e.g. noise.sigma=0.05")
        if math.isinf(self.clip):
            raise DefenseError(f"noise: clip={self.clip} must be finite and > 0; e.g. noise.clip=8.0")
        if not self.sigma >= 0:
            raise DefenseError(f"noise: sigma={self.sigma} must be >= 0; e.g. --defense-option noise.sigma=0.05")
        if not self.clip > 0:
            raise DefenseError(f"noise: clip={self.clip} must be > 0; e.g. --defense-option noise.clip=8.0")
        if not 0 < self.delta < 1:
            raise DefenseError(f"noise: delta={self.delta} must lie in (0, 1); e.g. noise.delta=1e-5")

    @property
    def cloud_must_know(self) -> bool:
        return self.replies

    def apply(self, x: torch.Tensor, positions: Sequence[int], session: int, direction: str,
              content: Sequence[int] | None = None, public: Sequence[bool] | None = None) -> torch.Tensor:
        """(T, d) states -> (T, d) released states, in x's dtype (noise computed in float32); ``public`` (T,)
        rows untouched."""
        if direction == "down" and not self.replies:
            return x
        y = clip_rows(x.float(), self.clip)
        if self.sigma > 0:
            key = draw_session(self.name, self.per_session, session, content) if direction == "up" else session
            noise = keyed_normal(self.seed, key, positions, direction, x.shape[-1], content)
            y = y + (self.sigma * self.clip) * noise.to(y.device)
        return keep_public(y, x.float(), public).to(x.dtype)

    def epsilon(self) -> float:
        return gaussian_epsilon(self.sigma / 2.0, self.delta)

    def describe(self) -> str:
        return (f"{self.label(public=True)}: ({self.epsilon():.3g}, {self.delta:g})-DP per released vector "
                f"(one vector replaced, L2 sensitivity 2C = {2 * self.clip:g}); not per token of text")
