"""``pclip``: a clip calibrated per position on public text, Gaussian noise scaled to it, the public opening untouched.

The Gaussian mechanism of :mod:`splitinfer.defenses.noise` (Dwork and Roth
2014, sec. 3.5) with two changes the defense-evaluation review asked for
(issue 28, findings 5 and 6; issue 29, defense 3):

- the clip is not one median norm for every position: position p < K gets its
  own clip C_p, the ``percentile`` of the public model's state norms at that
  position on public text, and positions >= K share one (K = 4 by default).
  Position 0 carries the attention sink (Xiao et al., ICLR 2024; Sun et al.,
  "Massive Activations in Large Language Models", COLM 2024) with a norm many
  times the others', and a shared median clip crushes it;
- the public opening (an added BOS, the chat template's first tokens: the
  leading run of the caller's ``public`` mask, see ``splitinfer.tokens``) is
  released untouched; a public token after user text has attended to it and
  is clipped and noised like any other.

A state at position p is clipped to ``||h|| <= C_p`` and released as
``h + N(0, (sigma C_p)^2 I)``: per released vector a Gaussian mechanism with
L2 sensitivity 2 C_p and noise multiplier sigma / 2, as for ``noise``. The
clips are public (the attacker may know them); they live in a profile
(:mod:`splitinfer.defenses.profiles`) made by :func:`calibrate_clips` and
:func:`save_clips`. Deviation: the percentile is taken over the public
model's states, not the user's (the user's text never calibrates anything the
cloud may learn).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from splitinfer.defenses.base import Defense, DefenseError, register_defense
from splitinfer.defenses.keyed import draw_session, keyed_normal
from splitinfer.defenses.noise import clip_rows, gaussian_epsilon, keep_public
from splitinfer.defenses.profiles import load_profile, save_profile

__all__ = ["PositionClip", "calibrate_clips", "save_clips"]


def calibrate_clips(norms: np.ndarray, positions: np.ndarray, public: np.ndarray | None, percentile: float,
                    k: int = 4) -> torch.Tensor:
    """(K+1,) clips: the ``percentile`` of the (N,) state ``norms`` at each position < k, then of positions >= k.

    ``public`` (N,) rows are left out (they are released untouched). A position with no user-text state takes
    the clip of positions >= k.
    """
    norms, positions = np.asarray(norms, dtype=np.float64), np.asarray(positions)
    keep = np.ones(len(norms), bool) if public is None else ~np.asarray(public, bool)
    rest = norms[keep & (positions >= k)]
    if not len(rest):
        raise DefenseError(f"pclip: no user-text state at positions >= {k} to calibrate on; give longer public text")
    out = [float(np.percentile(rest, percentile))]
    for p in range(k - 1, -1, -1):
        at = norms[keep & (positions == p)]
        out.insert(0, float(np.percentile(at, percentile)) if len(at) else out[-1])
    return torch.tensor(out, dtype=torch.float32)


def save_clips(clips: torch.Tensor, percentile: float, meta: dict, extra: dict | None = None,
               kind: str = "pclip") -> str:
    """Store per-position clips (and, for subclasses, ``extra`` tensors) as a profile; its key."""
    return save_profile(kind, {"clips": clips, **(extra or {})}, {**meta, "percentile": float(percentile)})


@register_defense("pclip")
@dataclass(frozen=True)
class PositionClip(Defense):
    """Clip each state to its position's calibrated clip C_p, add N(0, (sigma C_p)^2); public rows untouched."""

    sigma: float = 0.0
    percentile: float = 50.0
    profile: str = ""
    per_session: bool = True  # false: a resent token path gets the same draw in every session (keyed.draw_session)
    seed: int = 0
    delta: float = 1e-5

    kind = "wire"
    strength = ("sigma", "percentile")
    secret = ("seed",)
    shown = ("profile",)
    uses_public = True

    def validate(self) -> None:
        if not (0 <= self.sigma < float("inf")):
            raise DefenseError(f"{self.name}: sigma={self.sigma} must be finite and >= 0; e.g. {self.name}.sigma=0.05")
        if not 0 < self.percentile <= 100:
            raise DefenseError(f"{self.name}: percentile={self.percentile} must lie in (0, 100]; e.g. "
                               f"{self.name}.percentile=90")
        if not 0 < self.delta < 1:
            raise DefenseError(f"{self.name}: delta={self.delta} must lie in (0, 1); e.g. {self.name}.delta=1e-5")

    def tensors(self) -> dict[str, torch.Tensor]:
        """The profile's tensors, checked against this config (its percentile)."""
        tensors, meta = load_profile(self.profile, self.name)
        if abs(float(meta.get("percentile", -1)) - self.percentile) > 1e-9:
            raise DefenseError(f"{self.name}: profile {self.profile} was calibrated at percentile "
                               f"{meta.get('percentile')}, not {self.percentile}; pass {self.name}.percentile="
                               f"{meta.get('percentile')} or calibrate again")
        return tensors

    def row_clips(self, positions: Sequence[int]) -> torch.Tensor:
        """(T, 1) clip of each released row."""
        clips = self.tensors()["clips"]  # (K+1,)
        idx = torch.clamp(torch.as_tensor(list(positions), dtype=torch.long), max=len(clips) - 1)
        return clips[idx][:, None]

    def noise_scale(self, d: int) -> torch.Tensor:
        """(d,) per-dimension multiplier of sigma C_p (isotropic: ones)."""
        return torch.ones(d)

    def apply(self, x: torch.Tensor, positions: Sequence[int], session: int, direction: str,
              content: Sequence[int] | None = None, public: Sequence[bool] | None = None) -> torch.Tensor:
        """(T, d) head states -> (T, d) released states in x's dtype; the body's replies pass unchanged."""
        if direction == "down":
            return x
        c = self.row_clips(positions).to(x.device)  # (T, 1)
        y = clip_rows(x.float(), c)
        if self.sigma > 0:
            key = draw_session(self.name, self.per_session, session, content)
            z = keyed_normal(self.seed, key, positions, direction, x.shape[-1], content).to(y.device)  # (T, d)
            y = y + self.sigma * c * self.noise_scale(x.shape[-1]).to(y.device)[None] * z
        return keep_public(y, x.float(), public).to(x.dtype)

    def multiplier(self) -> float:
        """Noise std over L2 sensitivity (2 C_p) in the least-noised direction."""
        return self.sigma * float(self.noise_scale(1).min()) / 2.0

    def epsilon(self) -> float:
        return gaussian_epsilon(self.multiplier(), self.delta)

    def describe(self) -> str:
        return (f"{self.label(public=True)}: ({self.epsilon():.3g}, {self.delta:g})-DP per released vector "
                f"(one vector replaced, L2 sensitivity 2 C_p at its position's clip); not per token of text")
