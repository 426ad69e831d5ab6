"""``knn-match``: k-nearest-neighbour matching of a state to the attacker's own (state, token) pairs.

The attacker runs the public local layers over an auxiliary corpus (the harness gives it those pairs as
training taps), standardises and L2-normalises the states, and for every state the cloud sees ranks tokens by
the summed cosine similarity of its ``neighbours`` most similar training states (a k-NN classifier, Cover and
Hart 1967, as used for embedding inversion baselines, e.g. Song and Raghunathan 2020). Threat model: white-box
(learned): it only uses pairs it made with the published weights. Deviation for CPU speed: at most
``max_keys`` training states are kept (the first ones).

This file is the worked example of docs/extending.md: an :class:`~attacks.base.InversionAttack` with
``@register_attack``, ``_fit``/``_invert`` and a pickle-free ``_state``/``_load_state``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from attacks.base import Inversion, InversionAttack
from attacks.registry import register_attack
from attacks.tapdata import Taps


@register_attack("knn-match")
class KnnMatch(InversionAttack):
    """Cosine k-NN from a hidden state to the tokens of the nearest training states."""

    threat_model = "white-box (learned)"
    requires = frozenset({"pairs"})
    boundary_side = "head"
    defaults = {"neighbours": 8, "max_keys": 20000, "chunk": 1024}

    def _fit(self, train: Taps, val: Taps | None, trainer: Any) -> None:
        n = min(train.n_tokens, int(self.hparams["max_keys"]))
        x = torch.from_numpy(np.asarray(train.hidden[:n], dtype=np.float32))  # (n, d)
        self.mu, self.sd = x.mean(0), x.std(0) + 1e-6  # (d,), (d,)
        self.keys = torch.nn.functional.normalize((x - self.mu) / self.sd, dim=1)  # (n, d)
        self.values = torch.from_numpy(np.asarray(train.token_ids[:n], dtype=np.int64))  # (n,)
        self.fit_report["keys"] = n

    def _invert(self, taps: Taps, k: int) -> Inversion:
        m = min(int(self.hparams["neighbours"]), len(self.values))
        fill = torch.tensor(self.meta["unigram_top"], dtype=torch.int64)  # pads rows with fewer than k tokens
        topk = np.zeros((taps.n_tokens, k), dtype=np.int64)
        scores = np.zeros((taps.n_tokens, k), dtype=np.float32)
        step = int(self.hparams["chunk"])
        for s in range(0, taps.n_tokens, step):
            q = torch.from_numpy(np.asarray(taps.hidden[s:s + step], dtype=np.float32))  # (c, d)
            q = torch.nn.functional.normalize((q - self.mu) / self.sd, dim=1)
            sim, idx = (q @ self.keys.T).topk(m, dim=1)  # (c, m), (c, m)
            for i in range(len(q)):
                votes: dict[int, float] = {}
                for tok, w in zip(self.values[idx[i]].tolist(), sim[i].tolist()):
                    votes[tok] = votes.get(tok, 0.0) + w
                ranked = sorted(votes.items(), key=lambda kv: -kv[1])[:k]
                ranked += [(int(t), -1.0) for t in fill.tolist() if t not in votes][: k - len(ranked)]
                ranked += [(0, -2.0)] * (k - len(ranked))
                topk[s + i] = [t for t, _ in ranked]
                scores[s + i] = [w for _, w in ranked]
        return Inversion(topk[:, 0], topk, scores)

    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return {"keys": self.keys, "values": self.values, "mu": self.mu, "sd": self.sd}, {"keys": len(self.values)}

    def _load_state(self, tensors: dict[str, Any], state: dict[str, Any]) -> None:
        self.keys, self.values = tensors["keys"].float(), tensors["values"].long()
        self.mu, self.sd = tensors["mu"].float(), tensors["sd"].float()
