"""Recover generated tokens from the states the cloud body returns (``output-probe``, body/tail boundary).

At the body/tail boundary (``tail:B``, after ``L - B`` layers) the residual
stream is mostly busy predicting the NEXT token: the state at position t
carries token t+1, which is exactly what the local tail is about to sample.
This is the tuned/logit-lens observation (nostalgebraist 2020; Belrose et al.
2023, "Eliciting latent predictions with the tuned lens"), used here as an
attack: a linear probe (or an MLP, ``hidden > 0``) with two softmax heads over
the training vocabulary, one for the current token t and one for the next
token t+1, trained jointly on (state, token) pairs.

:meth:`OutputProbe.invert` (the base class's, no extra argument) returns one
guess per row, chosen by the hyper-parameter ``target``:

- ``next`` (default): the token generated from the state at that row (token
  t+1 from the state at t): what the local tail is about to sample, the
  output-side leakage. :attr:`reads` is ``next``: the harness scores it against
  the following token (teacher-forced) or the generated token (wire taps);
- ``current``: the token at that row (token t from the state at t): the token
  the body *received* at that position, i.e. input-side leakage read from
  output states; the harness reports it on the input side.

The former ``both`` (a validation-weighted mix) is gone: validation chose
next-token weight 0, so it equalled ``current``.

Deviation: the softmax covers the training vocabulary only (see
:mod:`attacks.recipes._common`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from attacks.errors import AttackError
from attacks.recipes._common import IGNORE, TokenClassifier
from attacks.registry import register_attack
from attacks.tapdata import Taps

TARGETS = ("next", "current")


@register_attack("output-probe")
class OutputProbe(TokenClassifier):
    """Probe on body-output states with a current-token and a next-token head; target 'next' or 'current'."""

    threat_model = "white-box (learned)"
    requires = frozenset({"pairs"})
    boundary_side = "tail"
    n_heads = 2  # head 0: current token, head 1: next token
    defaults = {**TokenClassifier.defaults, "epochs": 8, "lr": 3e-3, "batch_size": 256, "weight_decay": 1e-5,
                "hidden": 0, "target": "next"}

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        if self.hparams["target"] not in TARGETS:
            raise AttackError(f"output-probe target={self.hparams['target']!r}; choose one of {', '.join(TARGETS)} "
                              "('both' was removed: it equalled 'current')")

    @property
    def reads(self) -> str:  # type: ignore[override]
        """``next`` (output-side leakage) or ``current`` (input-side leakage), per ``target``."""
        return str(self.hparams["target"])

    def _build(self, d_in: int, n_classes: int) -> nn.Module:
        h = int(self.hparams["hidden"])
        if h <= 0:
            return nn.Linear(d_in, 2 * n_classes)  # (B, d) -> (B, 2 V_r)
        return nn.Sequential(nn.Linear(d_in, h), nn.GELU(), nn.LayerNorm(h), nn.Linear(h, 2 * n_classes))

    def _targets(self, taps: Taps) -> np.ndarray:
        return np.stack([taps.token_ids, taps.next_token_ids(IGNORE)], axis=1)  # (N, 2)

    def _combine(self, logp: torch.Tensor, taps: Taps) -> torch.Tensor:
        return logp[:, 1 if self.hparams["target"] == "next" else 0]  # (N, V_r): head 1 next, head 0 current
