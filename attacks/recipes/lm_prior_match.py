"""Language-model-prior decoding of noised states (``lm-prior-match``): matching evidence + the public model as a
prior over the whole sequence, with the noise scale estimated from the states themselves.

BeamClean (Kale et al., arXiv 2505.13758) inverts noised input embeddings by beam search that combines each
candidate's likelihood under the noise with the public language model's next-token probability; BiSR (Chen et
al., CCS 2024, arXiv 2409.00960) refines inversions with the public model's own language modelling and trains
noise-adaptive experts. Here, per position t and beam prefix x_<t, a candidate v scores

    log N(y_t; clip(h(x_<t, v)), Sigma) + lam * log p_LM(v | x_<t)

(:func:`attacks.recipes._match_beam.beam_match`, ``beam`` prefixes; the likelihood is
:class:`~attacks.recipes.vocab_match_whitened.WhitenedVocabMatch`'s). The public model runs forward as an
ordinary language model (:class:`attacks.recipes._beam.CausalLMPrior`, its KV cache reordered with the beams).

Where the noise scale is not public (``noise_scale=states``), it is estimated from the observed states:
``E||y||^2 = E||clip(h)||^2 + d (sigma C)^2``, so ``(sigma C)^2 = (mean ||y||^2 - mean ||clip(h)||^2) / d``
with ``h`` the public model's states of the attacker's own training text (:func:`estimate_noise_var`); the
covariance is then isotropic at that scale. ``noise_scale=public`` uses the residuals of the attacker's own
simulated releases, as ``vocab-match-whitened``.

The learned attackers get the same prior through ``lm-beam`` (a learned per-token attacker fitted on the
attacker's own defended pairs, re-ranked by the public model): the defenses stage lists both.

Deviations: BeamClean estimates the noise jointly with the tokens (EM); here the scale comes from second
moments before the search. BiSR's forward/backward refinement by optimisation is ``relaxed-inversion``'s
family, not this recipe. ``lam`` is fixed (default 1: the Bayes posterior when both terms are
log-likelihoods) rather than tuned on validation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from attacks.errors import AttackError
from attacks.recipes._beam import CausalLMPrior
from attacks.recipes.vocab_match_whitened import WhitenedVocabMatch
from attacks.registry import register_attack
from attacks.tapdata import Taps
from splitinfer.defenses.noise import clip_rows

SCALES = ("public", "states")


def estimate_noise_var(observed: np.ndarray, clean_sq: float) -> float:
    """Per-coordinate noise variance from second moments: (N, d) observed states and the mean squared norm of
    clipped clean states (independent noise adds d x its variance to it)."""
    y = np.asarray(observed, dtype=np.float64)  # (N, d)
    return max((float(np.mean(np.sum(y * y, 1))) - clean_sq) / y.shape[1], 1e-12)


@register_attack("lm-prior-match")
class LMPriorMatch(WhitenedVocabMatch):
    """White-box (exact), adaptive: beam-searched matching under the noise's likelihood plus a public-LM prior."""

    requires = frozenset({"head_weights", "language_model"})
    applies_to = ("noise",)  # its noise-scale estimate assumes one clip for every position (not pclip's C_t)
    defaults = {**WhitenedVocabMatch.defaults, "covariance": "isotropic", "lam": 1.0, "noise_scale": "states"}

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        if self.hparams["noise_scale"] not in SCALES:
            raise AttackError(f"lm-prior-match noise_scale={self.hparams['noise_scale']!r}; choose public or states")
        self.require_number("lam", 0, " (the prior's weight)")
        self.clean_sq = None  # mean ||clip(h)||^2 of the public model's states of the training text

    def _fit(self, train: Taps, val: Taps | None, trainer: Any) -> None:
        super()._fit(train, val, trainer)
        own = train.spread_tokens(int(self.hparams["residual_tokens"]))
        clean = torch.from_numpy(np.asarray(self._public_view(own).hidden, dtype=np.float32))  # (N, d)
        clip = self.release_clip(None, clean.shape[-1])  # noise only: one clip for every position
        clean = clean if clip is None else clip_rows(clean, clip)
        self.clean_sq = float(clean.double().pow(2).sum(-1).mean())

    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        tensors, state = super()._state()
        return tensors, {**state, "clean_sq": self.clean_sq}

    def _load_state(self, tensors: dict[str, Any], state: dict[str, Any]) -> None:
        super()._load_state(tensors, state)
        self.clean_sq = state.get("clean_sq")

    def language_prior(self) -> tuple[Any, float]:
        """The public model over the beams; it starts from the BOS unless the tokenizer puts one in the text
        itself (the taps then begin with it, matched like any token, and the prior starts flat)."""
        return CausalLMPrior.for_text(self._need_model()), float(self.hparams["lam"])

    def _beam_invert(self, taps: Taps, k: int):
        if self.hparams["noise_scale"] == "states":  # the scale from the observed states, not the spec
            var = estimate_noise_var(taps.hidden, self.clean_sq)
            self.factor = torch.full((taps.hidden_size,), var ** -0.5)
            self.fit_report["estimated_noise_std"] = var ** 0.5
        inv = super()._beam_invert(taps, k)
        inv.info["estimated_noise_std"] = self.fit_report.get("estimated_noise_std")
        return inv
