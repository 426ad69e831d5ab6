"""Full-vocabulary output for the softmax attackers: logits tied to the public input-embedding matrix.

With ``output=tied`` a :class:`~attacks.recipes._common.TokenClassifier`
builds its network with an output width of the embedding size ``d_e`` instead
of one row per training token, and :class:`TiedOutput` maps those features to
a logit for *every* token of the vocabulary: ``logits = f(x) @ E.T`` with
``E`` (V, d_e) the public base model's input-embedding matrix, frozen and
never stored in a checkpoint (it is read from the model at load time). A
token that never occurs in the training pairs still has a logit, given by
where its embedding lies, so the attacker is no longer capped by coverage.
This is weight tying (Press & Wolf 2017, "Using the output embedding to
improve language models"; Inan et al. 2017) applied to an inversion head, as
the embedding-space decoders of inversion attacks do (e.g. the nearest
neighbour decoding of Song & Raghunathan 2020, "Information leakage in
embedding models").

Deviations, for CPU speed: there is no per-token bias (it could not be learned
for unseen tokens); training uses a sampled softmax over the tokens seen in
training plus ``negatives`` tokens drawn once (seeded) from the rest of the
vocabulary (:func:`training_ids`), scoring uses the full vocabulary.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn


class TiedProjection(nn.Module):
    """(..., d_e) features -> (..., V') logits over the rows ``ids`` of the frozen embedding (all rows: None)."""

    def __init__(self, emb: torch.Tensor):
        super().__init__()
        self.register_buffer("emb", emb, persistent=False)  # (V, d_e): from the public model, never saved
        self.ids: torch.Tensor | None = None  # (V',) rows used while training (sampled softmax); None: every token

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        emb = self.emb if self.ids is None else self.emb[self.ids.to(self.emb.device)]  # (V', d_e)
        return h @ emb.T  # (..., V')


class TiedOutput(nn.Module):
    """A network producing d_e features, then :class:`TiedProjection`: same inputs, logits over the vocabulary."""

    def __init__(self, body: nn.Module, emb: torch.Tensor):
        super().__init__()
        self.body = body
        self.proj = TiedProjection(emb)

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.proj(self.body(*args))


def embedding_matrix(model: Any) -> torch.Tensor:
    """(V, d_e) float32 input-embedding matrix of a LoadedModel."""
    return model.model.get_input_embeddings().weight.detach().to("cpu", torch.float32)


def training_ids(seen: np.ndarray, vocab_size: int, negatives: int, seed: int) -> np.ndarray:
    """Sorted (V',) ids of the sampled softmax: every token seen in training and ``negatives`` others (seeded)."""
    rest = np.setdiff1d(np.arange(vocab_size), seen)
    n = min(int(negatives), len(rest))
    extra = np.random.default_rng(seed).choice(rest, n, replace=False) if n else rest[:0]
    return np.sort(np.concatenate([seen, extra])).astype(np.int64)


def inner(module: nn.Module) -> nn.Module:
    """The network inside a :class:`TiedOutput` (the module itself otherwise)."""
    return module.body if isinstance(module, TiedOutput) else module
