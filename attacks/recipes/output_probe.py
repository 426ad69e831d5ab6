"""Recover generated tokens from the states the cloud body returns (``output-probe``, body/tail boundary).

At the body/tail boundary (``tail:B``, after ``L - B`` layers) the residual
stream is mostly busy predicting the NEXT token: the state at position t
carries token t+1, which is exactly what the local tail is about to sample.
This is the tuned/logit-lens observation (nostalgebraist 2020; Belrose et al.
2023, "Eliciting latent predictions with the tuned lens"), used here as an
attack: a linear probe (or an MLP, ``hidden > 0``) with two softmax heads over
the training vocabulary, one for the current token t and one for the next
token t+1, trained jointly on (state, token) pairs.

:meth:`OutputProbe.invert` returns guesses aligned with the tokens (position t
guesses token t) in one of three modes (``target``):

- ``current``: token t from the state at t (what the state still holds of its input);
- ``next``: token t from the state at t-1 (the natural target: during
  generation the cloud sees the state at t-1 before the user sees token t);
- ``both`` (default): w * log p_next(token t | state t-1) + log p_cur(token t | state t),
  with w chosen on validation data from (1, 0.5, 0.25, 0) (1 without validation data).

The first position of each sequence has no previous state; ``next`` and
``both`` fall back to the current head there (counted in ``info``).
Deviation: the softmax covers the training vocabulary only (see
:mod:`attacks.recipes._common`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from attacks.base import Inversion
from attacks.errors import AttackError
from attacks.recipes._common import IGNORE, TokenClassifier
from attacks.registry import register_attack
from attacks.tapdata import Taps

TARGETS = ("both", "next", "current")
NEXT_WEIGHTS = (1.0, 0.5, 0.25, 0.0)


@register_attack("output-probe")
class OutputProbe(TokenClassifier):
    """Probe on body-output states with a current-token and a next-token head; target 'both', 'next' or 'current'."""

    threat_model = "shadow"
    requires = frozenset({"pairs"})
    boundary_side = "tail"
    n_heads = 2  # head 0: current token, head 1: next token
    defaults = {**TokenClassifier.defaults, "epochs": 8, "lr": 3e-3, "batch_size": 256, "weight_decay": 1e-5,
                "hidden": 0, "target": "both"}

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._check_target(self.hparams["target"])

    @staticmethod
    def _check_target(target: str) -> str:
        if target not in TARGETS:
            raise AttackError(f"output-probe target={target!r}; choose one of {', '.join(TARGETS)}")
        return target

    def _build(self, d_in: int, n_classes: int) -> nn.Module:
        h = int(self.hparams["hidden"])
        if h <= 0:
            return nn.Linear(d_in, 2 * n_classes)  # (B, d) -> (B, 2 V_r)
        return nn.Sequential(nn.Linear(d_in, h), nn.GELU(), nn.LayerNorm(h), nn.Linear(h, 2 * n_classes))

    def _targets(self, taps: Taps) -> np.ndarray:
        return np.stack([taps.token_ids, taps.next_token_ids(IGNORE)], axis=1)  # (N, 2)

    def _combine(self, logp: torch.Tensor, taps: Taps) -> torch.Tensor:
        target = self._mode
        cur = logp[:, 0]  # (N, V_r): token t from state t
        self._fallbacks = 0
        if target == "current":
            return cur
        first = torch.from_numpy(taps.seq_starts()[:-1])  # (S,) first row of each sequence
        self._fallbacks = int(len(first))
        nxt = torch.empty_like(cur)
        nxt[1:] = logp[:-1, 1]  # token t from state t-1
        nxt[first] = 0.0
        out = nxt if target == "next" else self.next_weight * nxt + cur
        out[first] = cur[first]
        return out

    def _fit(self, train: Taps, val: Taps | None, trainer: Any) -> None:
        super()._fit(train, val, trainer)
        if val is None:
            return
        logp, grid = self._logp(val), {}  # choose the weight of the next-token evidence in 'both' on val
        for w in NEXT_WEIGHTS:
            self.next_weight, self._mode = w, "both"
            pred = self.vocab[self._combine(logp, val).argmax(1).numpy()]
            grid[w] = float((pred == val.token_ids).mean())
        self.next_weight = max(NEXT_WEIGHTS, key=lambda w: (grid[w], -NEXT_WEIGHTS.index(w)))
        self.fit_report.update(next_weight=self.next_weight, next_weight_val_top1={str(k): v for k, v in grid.items()})

    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        tensors, state = super()._state()
        return tensors, {**state, "next_weight": self.next_weight}

    def _load_state(self, tensors: dict[str, Any], state: dict[str, Any]) -> None:
        super()._load_state(tensors, state)
        self.next_weight = float(state.get("next_weight", 1.0))

    def invert(self, taps: Any, k: int = 5, target: str | None = None) -> Inversion:
        """As :meth:`InversionAttack.invert`, with ``target`` overriding the hyper-parameter for this call."""
        self._mode = self._check_target(target or self.hparams["target"])
        inv = super().invert(taps, k)
        inv.info.update(target=self._mode, first_position_fallbacks=self._fallbacks)
        return inv

    _mode = "both"
    _fallbacks = 0
    next_weight = 1.0
