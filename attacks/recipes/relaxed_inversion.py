"""Optimisation-based inversion over a relaxed one-hot input (``relaxed-inversion``): the explicit baseline.

Gradient search for the input that reproduces the observed states: every position t holds logits
``z_t`` over the vocabulary, its input embedding is ``softmax(z_t / tau) E`` (a continuous relaxation of the
one-hot token), the whole sequence runs through the public local layers at once, and Adam lowers the
mismatch between the resulting states and the observed ones; the answer is each position's argmax (top-k
by logit). This is the joint, continuous-relaxation form of the optimisation attacks: SipIt (Nikolaou et al.,
arXiv 2510.15511) descends on a continuous input embedding position by position and snaps to tokens
(``vocab-match``'s gradient-guided candidates), and the continuous relaxation of arXiv 2607.00852 optimises a
softmax over the vocabulary per position, as here.

Adaptive (DESIGN.md section 4): under ``noise`` the mismatch is the Gaussian negative log-likelihood of the
observed state given the clipped candidate state, ``||y - clip(h)||^2 / (sigma C)^2``; under ``quant`` and
private layers (where the attacker holds only the public weights) the elementwise-relative distance of
:func:`attacks.recipes.vocab_match.match_distance`; permute is not handled (``vocab-match-adaptive`` is).

Deviations: no snapping or restarts (the papers re-run from the snapped tokens); a fixed temperature; one
sequence at a time; ``steps`` bounds the cost, so it is a baseline, not the strongest attacker.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from attacks.base import Inversion, InversionAttack
from attacks.errors import AttackError
from attacks.recipes.vocab_match import match_distance
from attacks.registry import register_attack
from attacks.tapdata import Taps
from splitinfer.defenses import DefenseError, DefensePipeline
from splitinfer.defenses.noise import clip_rows

log = logging.getLogger(__name__)


@register_attack("relaxed-inversion")
class RelaxedInversion(InversionAttack):
    """White-box (exact), adaptive: Adam over per-position vocabulary logits to reproduce the observed states."""

    threat_model = "white-box (exact)"
    requires = frozenset({"head_weights"})
    boundary_side = "head"
    scoring = "prefixes"  # seconds per token: scored on sequence prefixes like vocab-match
    adaptive = True
    refuses = ("permute", "random-split")  # the defenses stage does not run it there
    defaults = {"defense": "none", "steps": 200, "lr": 0.1, "tau": 1.0, "init": "zeros"}

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        try:
            self.defense = DefensePipeline.parse(str(self.hparams["defense"]))
        except DefenseError as e:
            raise AttackError(f"relaxed-inversion: {e}") from None
        if self.defense.get("permute") is not None:
            raise AttackError("relaxed-inversion does not undo permute; use vocab-match-adaptive there")
        self.require_int("steps")
        for key in ("lr", "tau"):
            if not isinstance(self.hparams[key], (int, float)) or self.hparams[key] <= 0:
                raise AttackError(f"relaxed-inversion {key}={self.hparams[key]!r}; give a number > 0")
        if self.hparams["init"] not in ("zeros", "uniform"):
            raise AttackError(f"relaxed-inversion init={self.hparams['init']!r}; choose zeros or uniform")
        self.noise = self.defense.get("noise")

    def _fit(self, train: Taps, val: Taps | None, trainer: Any) -> None:
        self._need_model()  # nothing to learn: the public head's weights are the whole attack

    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return {}, {}

    def _load_state(self, tensors: dict[str, Any], state: dict[str, Any]) -> None:
        pass

    def mismatch(self, h: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """(T, d) candidate states, (T, d) observed -> scalar loss (mean over positions)."""
        if self.noise is not None:
            h = clip_rows(h, self.noise.clip)
            if self.noise.sigma > 0:
                return (h - obs).pow(2).sum(-1).mean() / (self.noise.sigma * self.noise.clip) ** 2
        return match_distance(h, obs).pow(2).mean()

    @torch.no_grad()
    def _initial_loss(self, z0: torch.Tensor, emb: torch.Tensor, stack: Any, obs: torch.Tensor) -> torch.Tensor:
        from splitinfer.kv_cache import PartKVCache

        x = torch.softmax(z0 / float(self.hparams["tau"]), dim=-1) @ emb  # (T, d_e)
        return self.mismatch(stack.run_layers(x[None], torch.arange(len(obs)), PartKVCache(), None)[0].float(), obs)

    def _invert(self, taps: Taps, k: int) -> Inversion:
        from attacks.taps import TruncatedForward
        from splitinfer.kv_cache import PartKVCache

        model = self._need_model()
        hp = self.hparams
        depth = int(self.meta.get("depth") or taps.meta.get("depth"))
        device = next(model.model.parameters()).device
        stack = TruncatedForward(model.model, depth).eval()
        emb = model.model.get_input_embeddings().weight.detach()  # (V, d_e)
        vocab = emb.shape[0]
        topk, scores = np.zeros((taps.n_tokens, k), np.int64), np.zeros((taps.n_tokens, k), np.float32)
        gen = torch.Generator().manual_seed(self.seed)
        t0, final, initial = time.perf_counter(), [], []
        for _, rows in tqdm(list(taps.sequences()), desc="relaxed-inversion", unit="seq", leave=False,
                            disable=len(taps) < 8):
            obs = torch.as_tensor(np.asarray(taps.hidden[rows], dtype=np.float32), device=device)  # (T, d)
            t_n = len(obs)
            z0 = torch.zeros(t_n, vocab) if hp["init"] == "zeros" else torch.rand(t_n, vocab, generator=gen)
            z = z0.clone().to(device).requires_grad_(True)  # (T, V)
            opt = torch.optim.Adam([z], lr=float(hp["lr"]))
            with torch.enable_grad():
                for _ in range(int(hp["steps"])):
                    x = torch.softmax(z / float(hp["tau"]), dim=-1) @ emb  # (T, d_e)
                    h = stack.run_layers(x[None], torch.arange(t_n), PartKVCache(), None)[0].float()  # (T, d)
                    loss = self.mismatch(h, obs)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            final.append(float(loss.detach()))
            if not initial:
                initial.append(float(self._initial_loss(z0.to(device), emb, stack, obs)))
            top = z.detach().topk(min(k, vocab), dim=-1)
            topk[rows], scores[rows] = top.indices.cpu().numpy(), top.values.cpu().numpy()
        seconds = time.perf_counter() - t0
        info = {"seconds": round(seconds, 3), "seconds_per_token": seconds / max(taps.n_tokens, 1),
                "steps": int(hp["steps"]), "final_loss_median": float(np.median(final)) if final else None,
                "first_sequence_initial_loss": initial[0] if initial else None,
                "first_sequence_final_loss": final[0] if final else None}
        log.info("relaxed-inversion depth %d: %.3f s/token, final loss %s", depth, info["seconds_per_token"],
                 info["final_loss_median"])
        return Inversion(topk[:, 0], topk, scores, info)
