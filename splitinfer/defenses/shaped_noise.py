"""``shaped-noise``: per-dimension Gaussian noise shaped by the tail's sensitivity (inverse diagonal Fisher).

"Hidden-State Privacy Has an Empty Middle" (arXiv 2605.24042) releases
``h + N(0, Sigma_diag)`` with the covariance shaped by the downstream model's
sensitivity: more noise along directions the rest of the model barely reads,
less along the ones it depends on, so that at equal utility the total noise is
larger than isotropic noise's. Here the sensitivity is the diagonal of the
Fisher information of the model's next-token distribution with respect to the
state at the split, F_i = E[(d log p(y) / d h_i)^2], estimated on public text
with y drawn from the model itself (:func:`fisher_scale`). A state at position
p is clipped to C_p (``pclip``'s calibrated clips; the public opening
untouched) and released as ``h + sigma C_p (w * z)``, z ~ N(0, I), with
``w_i ~ (F_i + eps)^(-power)`` (power 1/2: covariance proportional to F^-1)
normalised so that mean(w^2) = 1: the same expected noise norm as ``pclip``
at the same sigma, which is its isotropic counterpart. The shape is public.

Deviations from the paper: the Fisher is the diagonal only, estimated from a
few thousand public tokens at positions >= 1; w is capped at ``cap`` times
its median either way (an unbounded ratio puts all the noise on dimensions
no attacker needs either); the guarantee per released vector is that of the
least-noised direction (multiplier sigma min(w) / 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from splitinfer.defenses.base import DefenseError, register_defense
from splitinfer.defenses.pclip import PositionClip
from splitinfer.defenses.rerun import boundary, frozen

__all__ = ["ShapedNoise", "fisher_diag", "fisher_scale"]


def fisher_diag(model: torch.nn.Module, depth: int, seqs: Sequence[Sequence[int]], seed: int = 0) -> torch.Tensor:
    """(d,) diagonal Fisher of the model's own next-token distribution w.r.t. the states after ``depth`` layers
    (positions >= 1; one sampled label per position)."""
    gen = torch.Generator().manual_seed(seed)  # labels drawn on the CPU: the same draws on every device
    device = next(model.parameters()).device
    total, n = None, 0
    with frozen(model):
        for seq in tqdm(seqs, desc="fisher", unit="seq", leave=False):
            leaf: list[torch.Tensor] = []

            def edit(h: torch.Tensor) -> torch.Tensor:  # (1, T, d): gradients land on this leaf
                leaf.append(h.detach().float().requires_grad_(True))
                return leaf[0].to(h.dtype)

            logits, _ = boundary(model, torch.tensor([list(seq)], device=device), {depth: edit})  # (1, T, V)
            logp = torch.log_softmax(logits[0].float(), -1)  # (T, V)
            y = torch.multinomial(logp.detach().exp().cpu(), 1, generator=gen).to(logp.device)  # (T, 1)
            logp.gather(1, y).sum().backward()
            g = leaf[0].grad[0, 1:]  # (T-1, d)
            total = g.pow(2).sum(0) if total is None else total + g.pow(2).sum(0)
            n += g.shape[0]
    if not n:
        raise DefenseError("shaped-noise: the Fisher estimate needs sequences of at least 2 tokens")
    return total / n


def fisher_scale(fisher: torch.Tensor, power: float = 0.5, cap: float = 10.0) -> torch.Tensor:
    """(d,) noise shape w ~ (F + eps)^(-power) within [median / cap, median * cap], mean(w^2) = 1."""
    f = fisher.double()
    w = (f + 1e-3 * f.mean()).pow(-power)
    med = w.median()
    w = torch.clamp(w, med / cap, med * cap)
    return (w / w.pow(2).mean().sqrt()).float()


@register_defense("shaped-noise")
@dataclass(frozen=True)
class ShapedNoise(PositionClip):
    """``pclip`` with the noise shaped per dimension by the profile's ``scale`` (inverse-Fisher, mean square 1)."""

    sigma: float = 0.05

    def noise_scale(self, d: int) -> torch.Tensor:
        scale = self.tensors()["scale"]  # (d,)
        if d != 1 and len(scale) != d:
            raise DefenseError(f"shaped-noise: profile {self.profile} shapes {len(scale)} dimensions, the states "
                               f"have {d}; calibrate it on this model")
        return scale
