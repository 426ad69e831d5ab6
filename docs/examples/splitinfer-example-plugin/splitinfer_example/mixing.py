"""``hidden-mix``: blend a secret orthogonal mixing of the hidden dimension into the states the head sends.

Each released state h (d,) becomes ``(1 - alpha) * h + alpha * (h @ Q)`` with Q a (d, d) orthogonal matrix
drawn from the secret ``seed`` (QR of a Gaussian matrix). The idea is that of the secret rotations of
STIP / PermLLM-style defenses (a transform of the hidden basis the cloud does not know); the deviation, and
the reason this is only an example, is that here the body is *not* given matching weights: it runs on the
mixed states as they are, so ``alpha`` trades utility for privacy (alpha = 0 is no defense). Public: alpha;
secret: seed (an adaptive attacker simulates the mechanism with its own seeds).

This file is the worked example of docs/extending.md: a frozen dataclass, ``@register_defense``, the
``kind``/``strength``/``secret`` declarations and ``apply`` on the wire.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from splitinfer.defenses.base import Defense, DefenseError, register_defense


@functools.lru_cache(maxsize=8)
def secret_rotation(seed: int, d: int) -> torch.Tensor:
    """(d, d) float32 orthogonal matrix drawn from ``seed`` (the same on every call)."""
    g = torch.Generator().manual_seed(int(seed))
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g))  # (d, d), (d, d)
    return q * torch.sign(torch.diagonal(r))[None, :]  # a unique Q: Haar-distributed


@register_defense("hidden-mix")
@dataclass(frozen=True)
class HiddenMix(Defense):
    """Release ``(1 - alpha) h + alpha h Q`` for a secret orthogonal Q."""

    alpha: float = 0.3
    seed: int = 0

    kind = "wire"
    strength = ("alpha",)
    secret = ("seed",)
    attackers = ("knn-match",)  # brought by this plugin: the defenses stage scores it beside the suite's attackers

    def validate(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise DefenseError(f"hidden-mix: alpha={self.alpha} must lie in [0, 1]; e.g. hidden-mix(alpha=0.3)")

    def apply(self, x: torch.Tensor, positions, session: int, direction: str, content=None) -> torch.Tensor:
        """(T, d) states -> (T, d) released states (replies pass unchanged)."""
        if direction == "down" or self.alpha == 0.0:
            return x
        q = secret_rotation(self.seed, x.shape[-1]).to(x.device)  # (d, d)
        y = (1.0 - self.alpha) * x.float() + self.alpha * (x.float() @ q)  # (T, d)
        return y.to(x.dtype)
