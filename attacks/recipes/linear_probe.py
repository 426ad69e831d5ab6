"""Linear attackers: a softmax probe (``linear-probe``) and a ridge map into the embedding space (``linear-embed``).

``linear-probe``: one linear layer from the standardised hidden state to the
token, trained with cross-entropy (the linear probe of Alain & Bengio 2016,
used for prompt inversion at shallow depths by e.g. Morris et al. 2023,
"Text embeddings reveal almost as much as text"). Deviation for CPU speed:
the softmax runs over the tokens seen in training only (see
:mod:`attacks.recipes._common`); scoring maps back to full-vocabulary ids.

``linear-embed``: closed-form ridge regression from the hidden state to the
token's *input embedding* ``E[token]``, decoded by nearest neighbour over the
whole embedding matrix (cosine or L2, whichever scores better on validation
data), so it can recover tokens never seen in training. The ridge strength is
picked on validation data from a small grid. Needs the public base model's
embedding matrix (``requires={"pairs", "embedding"}``); the matrix is read from
the model given at construction / load and never stored in the checkpoint.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from torch import nn

from attacks.base import Inversion, InversionAttack
from attacks.errors import AttackError
from attacks.recipes._common import TokenClassifier, fit_standardizer, standardize
from attacks.recipes._tied import embedding_matrix
from attacks.registry import register_attack
from attacks.tapdata import Taps

log = logging.getLogger(__name__)

_DECODE_CHUNK = 512  # rows per nearest-neighbour chunk: (512, V) scores


@register_attack("linear-probe")
class LinearProbe(TokenClassifier):
    """Linear softmax probe hidden -> token (restricted training vocabulary, scored as full-vocabulary ids)."""

    threat_model = "white-box (learned)"
    requires = frozenset({"pairs"})
    boundary_side = "head"
    defaults = {**TokenClassifier.defaults, "epochs": 8, "lr": 3e-3, "batch_size": 256, "weight_decay": 1e-5}

    def _build(self, d_in: int, n_classes: int) -> nn.Module:
        return nn.Linear(d_in, n_classes)  # (B, d) -> (B, V_r)


@register_attack("linear-embed")
class LinearEmbed(InversionAttack):
    """Closed-form ridge map hidden -> input embedding, decoded by nearest neighbour over the full vocabulary."""

    threat_model = "white-box (learned)"
    requires = frozenset({"pairs", "embedding"})
    boundary_side = "head"
    defaults = {"alphas": [1e-3, 1e-2, 1e-1, 1.0], "metric": "auto", "val_tokens": 1000, "clip": 10.0}

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        if self.hparams["metric"] not in ("auto", "cosine", "l2"):
            raise AttackError(f"linear-embed metric={self.hparams['metric']!r}; choose auto, cosine or l2")
        self.w = self.b = self.mu = self.sd = None
        self._emb: torch.Tensor | None = None

    # ------------------------------------------------------------ embedding
    def _embedding(self) -> torch.Tensor:
        if self._emb is None:
            self._emb = embedding_matrix(self._need_model())  # (V, d_e)
            self._emb_norm = torch.nn.functional.normalize(self._emb, dim=1)  # (V, d_e)
            self._emb_sq = (self._emb ** 2).sum(1)  # (V,)
        return self._emb

    def predict_embedding(self, taps: Taps) -> torch.Tensor:
        """(N, d_e) predicted input embeddings."""
        x = standardize(taps.hidden, self.mu, self.sd, self.hparams["clip"])  # (N, d)
        return x @ self.w + self.b

    def scores(self, y: torch.Tensor, metric: str | None = None) -> torch.Tensor:
        """(n, d_e) predicted embeddings -> (n, V) similarity to every token (higher = closer)."""
        emb = self._embedding()
        metric = metric or self.fit_report.get("metric", "cosine")
        if metric == "cosine":
            return torch.nn.functional.normalize(y, dim=1) @ self._emb_norm.T
        return 2.0 * y @ emb.T - self._emb_sq  # -||y - e||^2 + ||y||^2

    # ------------------------------------------------------------ fit
    def _fit(self, train: Taps, val: Taps | None, trainer: Any) -> None:
        emb = self._embedding()
        if int(train.token_ids.max()) >= len(emb):
            raise AttackError(f"token id {int(train.token_ids.max())} is outside the model's vocabulary of "
                              f"{len(emb)}; the taps come from another tokenizer")
        if val is None:  # hold out whole sequences of the training data for model selection
            n_val = max(1, len(train) // 10)
            perm = np.random.default_rng(self.seed).permutation(len(train))
            val, train = train.select_sequences(perm[:n_val]), train.select_sequences(np.sort(perm[n_val:]))
        self.mu, self.sd = fit_standardizer(train.hidden, seed=self.seed)
        gram, cross, xm, ym, n = self._moments(train, emb)
        val = val.spread_tokens(int(self.hparams["val_tokens"]))
        xv = standardize(val.hidden, self.mu, self.sd, self.hparams["clip"])  # (Nv, d)
        best = (-1.0, None, None)
        eye = torch.eye(gram.shape[0], dtype=torch.float64)
        metrics = ["cosine", "l2"] if self.hparams["metric"] == "auto" else [self.hparams["metric"]]
        grid = []
        for alpha in self.hparams["alphas"]:
            w = torch.linalg.solve(gram + alpha * n * eye, cross)  # (d, d_e)
            self.w, self.b = w.float(), (ym - xm @ w).float()
            for metric in metrics:
                acc = float((self._top(xv @ self.w + self.b, 1, metric)[1][:, 0] == torch.from_numpy(val.token_ids))
                            .double().mean())
                grid.append({"alpha": alpha, "metric": metric, "val_top1": acc})
                if acc > best[0]:
                    best = (acc, alpha, metric)
        acc, alpha, metric = best
        w = torch.linalg.solve(gram + alpha * n * eye, cross)
        self.w, self.b = w.float(), (ym - xm @ w).float()
        self.fit_report.update(alpha=alpha, metric=metric, val_top1=acc, grid=grid)
        log.info("linear-embed: alpha=%g metric=%s val top-1 %.3f", alpha, metric, acc)

    def _moments(self, taps: Taps, emb: torch.Tensor, chunk: int = 65536):
        """Centred normal equations in float64, accumulated in chunks: gram (d, d), cross (d, d_e), means, N."""
        n, d = taps.n_tokens, taps.hidden_size
        sx, sy = torch.zeros(d, dtype=torch.float64), torch.zeros(emb.shape[1], dtype=torch.float64)
        sxx = torch.zeros((d, d), dtype=torch.float64)
        sxy = torch.zeros((d, emb.shape[1]), dtype=torch.float64)
        for a in range(0, n, chunk):
            x = standardize(taps.hidden[a: a + chunk], self.mu, self.sd, self.hparams["clip"]).double()  # (c, d)
            y = emb[torch.from_numpy(taps.token_ids[a: a + chunk])].double()  # (c, d_e)
            sx, sy, sxx, sxy = sx + x.sum(0), sy + y.sum(0), sxx + x.T @ x, sxy + x.T @ y
        xm, ym = sx / n, sy / n
        return sxx - n * torch.outer(xm, xm), sxy - n * torch.outer(xm, ym), xm, ym, n

    # ------------------------------------------------------------ invert
    @torch.no_grad()
    def _top(self, y: torch.Tensor, k: int, metric: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        vals, idx = [], []
        for a in range(0, len(y), _DECODE_CHUNK):
            v, i = self.scores(y[a: a + _DECODE_CHUNK], metric).topk(k, dim=1)  # (n, k)
            vals.append(v)
            idx.append(i)
        return torch.cat(vals), torch.cat(idx)

    def _invert(self, taps: Taps, k: int) -> Inversion:
        vals, idx = self._top(self.predict_embedding(taps), k)
        return Inversion(idx[:, 0].numpy(), idx.numpy(), vals.numpy())

    # ------------------------------------------------------------ persistence
    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return ({"w": self.w, "b": self.b, "std.mu": torch.from_numpy(self.mu), "std.sd": torch.from_numpy(self.sd)},
                {"d_in": int(self.w.shape[0]), "d_emb": int(self.w.shape[1])})

    def _load_state(self, tensors: dict[str, Any], state: dict[str, Any]) -> None:
        self.w, self.b = tensors["w"].float(), tensors["b"].float()
        self.mu, self.sd = tensors["std.mu"].numpy(), tensors["std.sd"].numpy()
        if tuple(self.w.shape) != (state["d_in"], state["d_emb"]):
            raise ValueError(f"ridge map has shape {tuple(self.w.shape)}, the config says "
                             f"({state['d_in']}, {state['d_emb']})")
        if self.model is not None and self._embedding().shape[1] != self.w.shape[1]:
            raise AttackError(f"the model's embedding width {self._embedding().shape[1]} differs from the "
                              f"checkpoint's {self.w.shape[1]}; load the checkpoint's model")
