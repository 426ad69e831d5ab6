"""The seed paper's MLP decoder (``mlp``), under the seed's protocol and under a proper one.

Architecture after Cunningham (2026), arXiv 2602.16760: hidden -> 2048 ->
2048 -> vocabulary, GELU + LayerNorm after each hidden layer (our reading of
the order: Linear -> GELU -> LayerNorm), dropout ``dropout``; trained with
cross-entropy and AdamW.

Protocols (hyper-parameter ``protocol``):

- ``seed``: what the seed paper did: about ``seed_pairs`` = 880 (activation,
  token) pairs sampled from the training data and split at random at the
  *token* level (``seed_test_fraction`` held out), a fixed number of epochs,
  no validation. The accuracy on that random token split is reported as
  ``fit_report["seed_split_top1"]`` / ``["seed_split_top5"]`` (the seed's own
  number); :meth:`invert` on held-out documents shows what the same model
  really recovers.
- ``proper``: every training token, held-out *documents* for validation
  (early stopping) and test.

Deviations: the output softmax covers the tokens seen in training only (see
:mod:`attacks.recipes._common`); inputs are standardised per dimension.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from torch import nn

from attacks.errors import AttackError
from attacks.recipes._common import TokenClassifier
from attacks.registry import register_attack
from attacks.tapdata import Taps

log = logging.getLogger(__name__)


def seed_mlp(d_in: int, n_classes: int, width: int = 2048, dropout: float = 0.1) -> nn.Module:
    """The seed's decoder: (B, d_in) -> (B, n_classes)."""
    return nn.Sequential(
        nn.Linear(d_in, width), nn.GELU(), nn.LayerNorm(width), nn.Dropout(dropout),
        nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width), nn.Dropout(dropout),
        nn.Linear(width, n_classes),
    )


@register_attack("mlp")
class MLPProbe(TokenClassifier):
    """The seed's 3-layer MLP decoder (hidden -> 2048 -> 2048 -> vocab); protocol 'proper' or 'seed'."""

    threat_model = "white-box (learned)"
    requires = frozenset({"pairs"})
    boundary_side = "head"
    defaults = {**TokenClassifier.defaults, "epochs": 6, "lr": 1e-3, "batch_size": 128, "weight_decay": 1e-4,
                "width": 2048, "dropout": 0.1, "protocol": "proper", "seed_pairs": 880, "seed_test_fraction": 0.2,
                "seed_epochs": 60}

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        if self.hparams["protocol"] not in ("proper", "seed"):
            raise AttackError(f"mlp protocol={self.hparams['protocol']!r}; choose 'proper' (held-out documents, "
                              "all training tokens) or 'seed' (about 880 pairs, random token-level split)")
        if self.hparams["protocol"] == "seed" and self.hparams["backoff"] == "auto":
            self.hparams["backoff"] = "none"  # the seed's decoder has no open-vocabulary backoff

    def _build(self, d_in: int, n_classes: int) -> nn.Module:
        return seed_mlp(d_in, n_classes, int(self.hparams["width"]), float(self.hparams["dropout"]))

    def _fit(self, train: Taps, val: Taps | None, trainer: Any) -> None:
        if self.hparams["protocol"] == "proper":
            super()._fit(train, val, trainer)
            self.fit_report["protocol"] = "proper"
            return
        rng = np.random.default_rng(self.seed)
        n = min(int(self.hparams["seed_pairs"]), train.n_tokens)
        rows = rng.choice(train.n_tokens, n, replace=False)
        n_test = max(1, int(round(n * float(self.hparams["seed_test_fraction"]))))
        test_rows, train_rows = rows[:n_test], rows[n_test:]
        if len(train_rows) == 0:
            raise AttackError(f"mlp seed protocol: {n} pairs leave nothing to train on; raise seed_pairs")
        sub_train, sub_test = train.select_tokens(train_rows), train.select_tokens(test_rows)
        epochs = self.hparams["epochs"]
        self.hparams["epochs"] = int(self.hparams["seed_epochs"])
        try:  # the seed trains a fixed number of epochs with no validation set
            from dataclasses import replace

            from attacks.trainer import TrainConfig

            cfg = replace(trainer or TrainConfig(), epochs=None, patience=None)
            super()._fit(sub_train, None, cfg)
        finally:
            self.hparams["epochs"] = epochs
        inv = self._invert(sub_test, 5)
        truth = sub_test.token_ids
        self.fit_report.update(
            protocol="seed", seed_pairs=int(n), seed_train_pairs=int(len(train_rows)), seed_test_pairs=int(n_test),
            seed_split_top1=float((inv.topk[:, 0] == truth).mean()),
            seed_split_top5=float((inv.topk == truth[:, None]).any(1).mean()),
        )
        log.info("mlp seed protocol: top-1 %.3f on its own random token split of %d pairs",
                 self.fit_report["seed_split_top1"], n_test)
