"""Whitened (Mahalanobis) vocabulary matching under noise (``vocab-match-whitened``).

"Hidden-State Privacy Has an Empty Middle" (arXiv 2605.24042) reports an adaptive attacker that scores
candidates by their likelihood under the noise's own covariance (Mahalanobis distance) at 100% top-1
against a noise mechanism that defeats Euclidean retrieval: when the noise is anisotropic (shaped per
dimension, e.g. by the tail's sensitivity), the Euclidean nearest candidate is pulled by the noisy
dimensions, while whitening weights each dimension by how much the noise can move it.

The attacker is adaptive (DESIGN.md section 4): it knows the mechanism and its public parameters, never the
victim's draws. It estimates the noise's covariance from its own simulated releases: the defended training
states it is fitted on (made with its own draws, :func:`attacks.defended.attacker_view`) minus the clipped
states the public model gives for the same tokens, ``r = y - clip(h)``; ``covariance`` = ``full`` (shrunk
towards its mean variance by ``shrinkage``, Ledoit-Wolf style), ``diagonal`` or ``isotropic`` (its mean
variance: Euclidean matching, the comparison). Each candidate v is scored by ``-1/2 r_v^T Sigma^-1 r_v`` with
``r_v = y - clip(h_v)``, in :class:`AdaptiveVocabMatch`'s beam search over positions (whole vocabulary up to
``full_vocab_max`` tokens, else the proposer's first ``capped_candidates``). The clip C is the wire defense's
public ``clip`` where it has one; under ``pclip`` and ``shaped-noise`` it is the position's calibrated C_t and
the residuals are divided by C_t before the covariance is estimated (their noise is ``sigma C_t w z``: one
covariance over positions after that scaling), and so is each candidate's residual when it is scored.

Deviations from the paper: the covariance is estimated from the attacker's own releases (the paper's
attacker is told Sigma); full covariance needs many more residuals than dimensions (d = 576 on the default
model: the shrinkage makes it invertible on a few thousand); the clip is applied before whitening (as the
mechanism does), so a state clipped by the victim is matched against a clipped candidate.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from attacks.errors import AttackError
from attacks.recipes.vocab_match_adaptive import AdaptiveVocabMatch
from attacks.registry import register_attack
from attacks.tapdata import Taps
from splitinfer.defenses.noise import clip_rows

COVARIANCES = ("full", "diagonal", "isotropic")


def precision_factor(residuals: torch.Tensor, kind: str, shrinkage: float) -> torch.Tensor:
    """(N, d) residuals -> (d, d) factor L with Sigma^-1 = L L^T (full), or (d,) 1/std (diagonal, isotropic)."""
    r = residuals.double() - residuals.double().mean(0)  # (N, d)
    var = r.pow(2).mean(0)  # (d,)
    if kind == "isotropic":
        return torch.full_like(var, float(var.mean()) ** -0.5).float()
    if kind == "diagonal":
        return var.clamp_min(1e-12 * float(var.mean())).rsqrt().float()
    cov = r.T @ r / max(1, len(r) - 1)  # (d, d)
    cov = (1 - shrinkage) * cov + shrinkage * float(var.mean()) * torch.eye(len(var), dtype=cov.dtype)
    return torch.linalg.cholesky(torch.linalg.inv(cov)).float()  # (d, d) lower


def whitened_sq(r: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """(B, d) residuals -> (B,) squared Mahalanobis norms ``r^T Sigma^-1 r`` under :func:`precision_factor`."""
    w = r @ factor if factor.ndim == 2 else r * factor  # (B, d)
    return w.pow(2).sum(-1)


@register_attack("vocab-match-whitened")
class WhitenedVocabMatch(AdaptiveVocabMatch):
    """White-box (exact), adaptive: beam-searched matching scored by the noise's Mahalanobis likelihood."""

    applies_to = ("noise", "pclip", "shaped-noise")  # the defenses it is designed to break (the stage's lists)
    defaults = {**AdaptiveVocabMatch.defaults, "covariance": "diagonal", "shrinkage": 0.1,
                "residual_tokens": 20000}

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        if self.hparams["covariance"] not in COVARIANCES:
            raise AttackError(f"{self.name} covariance={self.hparams['covariance']!r}; choose one of "
                              f"{', '.join(COVARIANCES)}")
        if not 0 <= float(self.hparams["shrinkage"]) <= 1:
            raise AttackError(f"{self.name} shrinkage={self.hparams['shrinkage']!r}; give a number in [0, 1]")
        self.inexact = True  # noise of any shape: nothing matches exactly, every position is beam-searched
        self.factor: torch.Tensor | None = None  # precision_factor of the fitted residuals

    def row_clips(self, positions: np.ndarray, d: int) -> torch.Tensor | None:
        """(N, 1) the clip the wire defense applied to each row at ``positions`` (N,), or None without a clip."""
        clip = {int(p): self.release_clip(int(p), d) for p in np.unique(positions)}  # one look-up per position
        if None in clip.values():
            return None
        return torch.tensor([clip[int(p)] for p in positions], dtype=torch.float32)[:, None]

    def _residual(self, y: torch.Tensor, h: torch.Tensor, clip: torch.Tensor | float | None) -> torch.Tensor:
        """(N, d) ``y - clip(h)`` in the units the covariance is estimated in: divided by the clip under pclip /
        shaped-noise, whose noise grows with each position's C_t (``clip``: one per row, or one for all)."""
        if clip is None:
            return y - h
        r = y - clip_rows(h, clip)
        return r / clip if self.pclip is not None else r

    def _fit(self, train: Taps, val: Taps | None, trainer: Any) -> None:
        super()._fit(train, val, trainer)
        own = train.spread_tokens(int(self.hparams["residual_tokens"]))
        clean = torch.from_numpy(np.asarray(self._public_view(own).hidden, dtype=np.float32))  # (N, d)
        y = torch.from_numpy(np.asarray(own.hidden, dtype=np.float32))  # (N, d)
        noised = ~self.untouched(clean, y)  # (N,) public rows are released untouched: no noise to estimate there
        clean, y, positions = clean[noised], y[noised], own.positions()[noised.numpy()]
        r = self._residual(y, clean, self.row_clips(positions, clean.shape[-1]))  # (N', d)
        self.factor = precision_factor(r, str(self.hparams["covariance"]), float(self.hparams["shrinkage"]))
        self.fit_report.update(residuals=int(len(r)), noise_rms=float(r.pow(2).mean().sqrt()))

    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        tensors, state = super()._state()
        return {**tensors, "factor": self.factor}, state

    def _load_state(self, tensors: dict[str, Any], state: dict[str, Any]) -> None:
        super()._load_state({k: v for k, v in tensors.items() if k != "factor"}, state)
        self.factor = tensors["factor"].float()

    def log_likelihood(self, h: torch.Tensor, obs: torch.Tensor, t: int | None = None) -> torch.Tensor:
        """(B, d), (d,) observed at position ``t`` -> (B,): minus half the squared Mahalanobis residual."""
        r = self._residual(obs, h, self.release_clip(t, h.shape[-1]))  # (B, d)
        return -0.5 * whitened_sq(r, self.factor.to(h.device))
