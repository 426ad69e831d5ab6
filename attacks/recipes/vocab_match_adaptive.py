"""Adaptive vocabulary matching (``vocab-match-adaptive``): the white-box inversion with a matching rule
made for the known defense.

The attacker knows the mechanism and its public parameters (DESIGN.md section 4,
``adaptive``), not the victim's draws. It runs :class:`VocabMatch`'s search
(left to right, candidates from a ridge proposer fitted on *defended*
training taps made with its own seed, see :func:`attacks.defended.attacker_view`)
and replaces the distance:

- ``noise`` (clip C, std sigma*C): the observed state is ``clip(h) + N(0,
  (sigma C)^2 I)``, so the maximum-likelihood candidate minimises
  ``||y - clip(h_v)||^2``; the distance is that over ``d (sigma C)^2`` (about 1
  for the true token: a chi-square over its degrees of freedom). Vocabulary
  matching against noised states as in "Hidden No More" (Zhang et al., ICML
  2025), with the Gaussian likelihood under the known sigma. Nothing is
  accepted early (a noised match is never exact): every position scans the
  first ``max_candidates`` of the proposer's ranking and keeps the likeliest.
- ``quant``: dequantise-then-match: candidates are put through the same
  quantiser (on the fp16 wire values) before the elementwise-relative distance,
  so the true token matches to float rounding and the early acceptance holds.

Deviation: with noise and quant composed the likelihood ignores the
quantisation of the noised value (its error is far below sigma*C at the
strengths measured). The gradient-guided search is off under noise (it needs an
exact match to stop).
"""

from __future__ import annotations

from typing import Any

import torch

from attacks.errors import AttackError
from attacks.recipes.vocab_match import VocabMatch, match_distance
from attacks.registry import register_attack
from splitinfer.defenses import DefenseError, DefensePipeline
from splitinfer.defenses.noise import clip_rows


@register_attack("vocab-match-adaptive")
class AdaptiveVocabMatch(VocabMatch):
    """White-box (exact), adaptive: vocab-match with the known defense's likelihood (noise) or quantiser."""

    adaptive = True
    defaults = {**VocabMatch.defaults, "defense": "none", "max_candidates": 1024, "batch_sizes": [64, 960]}

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        try:
            self.defense = DefensePipeline.parse(str(self.hparams["defense"]))
        except DefenseError as e:
            raise AttackError(f"vocab-match-adaptive: {e}") from None
        self.noise = self.defense.get("noise")
        if self.noise is not None and self.noise.sigma > 0:
            self.hparams["tol"] = -1.0  # never accept early: scan the candidates, keep the likeliest
            self.hparams["grad_steps"] = 0

    def distance(self, h: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:  # (B, d), (d,) -> (B,)
        if self.noise is not None:
            h = clip_rows(h, self.noise.clip)
            if self.noise.sigma > 0:
                return (h - obs).pow(2).mean(-1) / (self.noise.sigma * self.noise.clip) ** 2
        if self.defense.codec is not None:
            h = self.defense.codec.roundtrip(h.to(torch.float16))
        return match_distance(h, obs)
