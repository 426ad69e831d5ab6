"""A small bidirectional transformer reading the whole activation sequence, predicting every token (``seq-decoder``).

Learned sequence-level inversion in the spirit of the inversion models of
Morris et al. (2023, "Language model inversion") and of the
activation-inversion attacks on split learning (e.g. "Unsplit", Erdogan et al.
2022; Li et al. 2023, "Sentence embedding leaks more information than you
expect"): unlike a per-token probe it uses context on both sides, so a
token blurred at one position can be recovered from its neighbours' states
(subword continuations, syntax, repeated names).

Architecture: standardised hidden states (B, T, d) -> Linear(d, d_model) +
learned position embedding -> ``layers`` pre-norm TransformerEncoder layers
(bidirectional self-attention, GELU, key padding mask) -> LayerNorm ->
Linear(d_model, |V_train|), plus (``skip``) a linear map from each position's
own state to the logits, fitted first as a linear probe (``probe_epochs``)
while the transformer's output layer starts at zero: the decoder starts as the
per-token probe and training adds a context correction. Trained on whole sequences with cross-entropy at
every position.

Options that give context a fair chance (issue 14, finding 10): by default
the fitted skip path is frozen (``freeze_skip=True``) and training stops after
``patience`` = 2 epochs without a better validation score, so the decoder
stays near the probe; ``freeze_skip=False`` trains the skip path jointly,
``epochs`` / ``patience`` lengthen the schedule, ``output=tied`` scores the
full vocabulary (:mod:`attacks.recipes._tied`), and the ``lm-beam`` recipe
(:mod:`attacks.recipes.lm_beam`) adds a language prior at decoding time.
Deviation: non-autoregressive (one parallel prediction per position; beam
search only through ``lm-beam``), softmax restricted to the training vocabulary by default (see
:mod:`attacks.recipes._common`). Trainable under ``accelerate launch
--num_processes N`` (DDP; gloo on CPU) through :mod:`attacks.trainer`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from attacks.errors import AttackError
from attacks.recipes._common import IGNORE, TokenClassifier
from attacks.recipes._tied import inner
from attacks.registry import register_attack


class SeqDecoderNet(nn.Module):
    """(B, T, d_in), pad mask (B, T) -> logits (B, T, n_classes)."""

    def __init__(self, d_in: int, n_classes: int, d_model: int = 256, layers: int = 2, heads: int = 4,
                 d_ff: int = 512, dropout: float = 0.1, max_len: int = 2048, skip: bool = True):
        super().__init__()
        self.skip = nn.Linear(d_in, n_classes) if skip else None  # each position's own state -> logits
        self.inp = nn.Linear(d_in, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, d_ff, dropout, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, n_classes)
        if skip:  # start as the per-token probe; the transformer learns a context correction
            nn.init.zeros_(self.out.weight)
            nn.init.zeros_(self.out.bias)
        self.max_len = max_len

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        pos = torch.arange(t, device=x.device).clamp(max=self.max_len - 1)  # (T,)
        h = self.inp(x) + self.pos(pos)[None]  # (B, T, d_model)
        h = self.enc(h, src_key_padding_mask=pad)  # (B, T, d_model)
        logits = self.out(self.norm(h))  # (B, T, n_classes)
        return logits if self.skip is None else logits + self.skip(x)


@register_attack("seq-decoder")
class SeqDecoder(TokenClassifier):
    """Bidirectional transformer over the whole activation sequence, predicting every token from context."""

    threat_model = "white-box (learned)"
    requires = frozenset({"pairs"})
    boundary_side = "head"
    sequence_level = True
    defaults = {**TokenClassifier.defaults, "epochs": 8, "lr": 1e-3, "batch_size": 8, "weight_decay": 0.05,
                "d_model": 256, "layers": 2, "heads": 4, "d_ff": 512, "dropout": 0.3, "max_len": 2048, "skip": True,
                "probe_epochs": 5, "freeze_skip": True, "patience": 2}

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        for key in ("freeze_skip", "skip"):
            if not isinstance(self.hparams[key], bool):
                raise AttackError(f"seq-decoder {key}={self.hparams[key]!r}; write {key}=true or {key}=false")
        p = self.hparams["patience"]
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise AttackError(f"seq-decoder patience={p!r}; give the epochs without a better validation score "
                              "before stopping, an integer >= 1 (e.g. patience=100 to train every epoch)")

    def _fit(self, train: Any, val: Any, trainer: Any) -> None:
        from dataclasses import replace

        from attacks.trainer import TrainConfig

        super()._fit(train, val, replace(trainer or TrainConfig(), patience=int(self.hparams["patience"])))

    def _build(self, d_in: int, n_classes: int) -> nn.Module:
        hp = self.hparams
        return SeqDecoderNet(d_in, n_classes, int(hp["d_model"]), int(hp["layers"]), int(hp["heads"]),
                             int(hp["d_ff"]), float(hp["dropout"]), int(hp["max_len"]), bool(hp["skip"]))

    def _warm_start(self, module: nn.Module, x: torch.Tensor, y: torch.Tensor, trainer: Any) -> None:
        """Fit the skip path alone first, as a linear probe on token rows (``probe_epochs``, batch 256)."""
        epochs = int(self.hparams["probe_epochs"])
        net = inner(module)  # the SeqDecoderNet (inside the tied output with output=tied)
        if net.skip is None or epochs < 1:
            return
        probe = net.skip if net is module else nn.Sequential(net.skip, module.proj)  # (n, d) -> (n, V_r)
        from dataclasses import replace

        from attacks.trainer import TrainConfig, fit_module

        rows = torch.from_numpy(np.flatnonzero((y[:, 0] != IGNORE).numpy()))
        ce = nn.CrossEntropyLoss(ignore_index=IGNORE)

        def loss_fn(m: nn.Module, idx: torch.Tensor) -> torch.Tensor:
            r = rows[idx]
            dev = next(m.parameters()).device
            return ce(m(x[r].to(dev)), y[r, 0].to(dev))

        cfg = replace(trainer or TrainConfig(), epochs=None, lr=None, batch_size=None, patience=None)
        report = fit_module(probe, len(rows), loss_fn, epochs=epochs, lr=3e-3, batch_size=256, seed=self.seed,
                            cfg=cfg, tag=f"{self.name}-probe")
        self.fit_report["probe_warm_start"] = {k: report[k] for k in ("epochs_run", "train_seconds")}
        if self.hparams["freeze_skip"]:
            net.skip.requires_grad_(False)

    def _forward(self, module: nn.Module, x: Any, taps_seqs: Any = None) -> torch.Tensor:
        out = module(*x)  # (B, T, V_r)
        return out.reshape(*out.shape[:-1], self.n_heads, -1)  # (B, T, 1, V_r)
