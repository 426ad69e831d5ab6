"""Beam search over positions for the matching attackers: no greedy commit, no search that switches itself off.

Where no candidate can match an observed state exactly (noise on the wire, private local layers), the
greedy left-to-right commit of :class:`attacks.recipes.vocab_match.VocabMatch` keeps one prefix: a wrong
token at position t feeds a wrong prefix to every later position and nothing repairs it. Here every
position scores the same candidate set under each of ``width`` surviving prefixes (beams), one batched
forward of the local layers per ``max_batch`` (beam, candidate) rows on a KV cache holding every beam's
prefix (:class:`BeamCache`), and keeps the ``width`` best (beam, candidate) pairs by summed
log-likelihood, plus ``lam`` x the public model's log-probability when a language-model prior is given
(BeamClean, Kale et al., arXiv 2505.13758: beam decoding of noised embeddings with the public model as
prior). Every position is searched alike: there is no "missed" state.

:func:`beam_match` is the pure search; the model-facing parts are passed in (``forward`` runs candidate
rows, ``loglik`` scores them against the observed state), so the search is tested on hand-made functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


class BeamCache:
    """KV cache of W beam prefixes serving B one-token candidate rows, row b extending beam ``src[b]``
    (duck-types PartKVCache for :meth:`splitinfer.partition.LayerStack.run_layers`)."""

    def __init__(self) -> None:
        self.keys: dict[int, torch.Tensor] = {}  # layer -> (W, H_kv, S, D_h)
        self.values: dict[int, torch.Tensor] = {}
        self.new: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> the rows' (B, H_kv, 1, D_h) k, v
        self.positions = torch.zeros(0, dtype=torch.long)  # (S,)
        self.src = torch.zeros(0, dtype=torch.long)  # (B,) beam of each row of the current batch

    def __len__(self) -> int:
        return int(self.positions.numel())

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return len(self)

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        self.new[layer_idx] = (key, value)
        if layer_idx not in self.keys:
            return key, value
        src = self.src.to(key.device)
        k = torch.cat([self.keys[layer_idx].index_select(0, src), key], dim=2)  # (B, H_kv, S+1, D_h)
        v = torch.cat([self.values[layer_idx].index_select(0, src), value], dim=2)
        return k, v

    def append_positions(self, positions: torch.Tensor) -> None:
        pass  # the prefixes grow only by commit()

    def commit(self, position: int) -> None:
        """The rows of the last batch become the beams (the caller ran exactly the surviving rows)."""
        for layer, (k, v) in self.new.items():
            if layer in self.keys:
                src = self.src.to(k.device)
                self.keys[layer] = torch.cat([self.keys[layer].index_select(0, src), k], dim=2)
                self.values[layer] = torch.cat([self.values[layer].index_select(0, src), v], dim=2)
            else:
                self.keys[layer], self.values[layer] = k, v
        self.new = {}
        self.positions = torch.cat([self.positions, torch.tensor([position])])


@dataclass(frozen=True)
class BeamResult:
    """One sequence's best path and per-position rankings."""

    path: np.ndarray  # (T,) token ids of the best path
    topk: np.ndarray  # (T, k) ranked guesses: the path's token first, then the candidates under the path's prefix
    scores: np.ndarray  # (T, k) their log-likelihoods (+ lam x LM log-prob) under that prefix
    rows: int  # (beam, candidate) rows run through the local layers


def beam_match(n_pos: int, candidates: Callable[[int], np.ndarray | None],
               forward: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
               loglik: Callable[[torch.Tensor, int], torch.Tensor], commit: Callable[[int], None], width: int,
               max_batch: int, k: int, lm: Any = None, lam: float = 0.0, lm_top: int = 0) -> BeamResult:
    """Beam search over ``n_pos`` positions of one sequence.

    candidates(t) -> (C,) token ids tried at position t (the same for every beam), or None: then the union of
    the ``lm_top`` likeliest next tokens under each live beam's prefix (a position without evidence of its
    own, e.g. one the attacker does not see; needs ``lm``);
    forward(src (B,), tokens (B,), t) -> (B, d) states of rows extending beam ``src[b]`` with ``tokens[b]``;
    loglik(states (B, d), t) -> (B,) log-likelihood of the observed state at t given each row;
    commit(t): the rows of the last ``forward`` call become the beams (the search re-runs the survivors);
    lm: None or an :class:`attacks.recipes._beam.LMPrior` over ``width`` rows (start / step with parents).
    """
    score = torch.full((width,), float("-inf"), dtype=torch.float64)
    score[0] = 0.0  # one live beam at the start
    lm_lp = lm.start(width) if lm is not None else None  # (W, V)
    back_parent, back_token, ranks, rows_run = [], [], [], 0
    for t in range(n_pos):
        live = torch.nonzero(torch.isfinite(score)).flatten()  # (W',) beams worth extending
        proposed = candidates(t)
        if proposed is None:
            if lm is None or lm_top < 1:
                raise ValueError("beam_match: candidates(t) gave None, which needs a language-model prior and "
                                 "lm_top >= 1")
            proposed = torch.unique(lm_lp[live].topk(min(lm_top, lm_lp.shape[-1]), dim=-1).indices).numpy()
        cand = torch.as_tensor(np.asarray(proposed, dtype=np.int64))  # (C,)
        n_c = len(cand)
        src = live.repeat_interleave(n_c)  # (W'*C,)
        tok = cand.repeat(len(live))  # (W'*C,)
        ll = torch.cat([loglik(forward(src[a: a + max_batch], tok[a: a + max_batch], t), t).double().cpu()
                        for a in range(0, len(src), max_batch)])  # (W'*C,)
        rows_run += len(src)
        local = ll.view(len(live), n_c)  # (W', C)
        if lm_lp is not None and lam:
            local = local + lam * lm_lp[live][:, cand].double()
        total = score[live][:, None] + local  # (W', C)
        best, flat = total.flatten().topk(min(width, total.numel()))  # (W,)
        parent, pick = live[flat // n_c], flat % n_c
        back_parent.append(parent.numpy())
        back_token.append(cand[pick].numpy())
        ranks.append((live.numpy(), cand.numpy(), local.numpy()))
        forward(parent, cand[pick], t)  # the survivors once more: their keys and values become the beams
        commit(t)
        score = torch.full((width,), float("-inf"), dtype=torch.float64)
        score[: len(best)] = best
        if lm is not None and t + 1 < n_pos:
            pad = width - len(best)  # rows beyond the survivors repeat the last one (never extended)
            toks = torch.cat([cand[pick], cand[pick][-1:].repeat(pad)])
            pars = torch.cat([parent, parent[-1:].repeat(pad)])
            lm_lp = lm.step(toks, pars)  # (W, V)
    path, top, sc = np.zeros(n_pos, np.int64), np.zeros((n_pos, k), np.int64), np.zeros((n_pos, k), np.float32)
    b = int(score.argmax())
    for t in range(n_pos - 1, -1, -1):
        parent = int(back_parent[t][b])
        path[t] = back_token[t][b]
        live, cand, local = ranks[t]
        row = local[int(np.nonzero(live == parent)[0][0])]  # (C,) under the path's prefix
        order = np.argsort(-row, kind="stable")
        order = np.concatenate([np.nonzero(cand == path[t])[0][:1], order[cand[order] != path[t]]])[:k]
        top[t, : len(order)], sc[t, : len(order)] = cand[order], row[order]
        if len(order) < k:  # fewer candidates than k: pad with the path token, scored -inf
            top[t, len(order):], sc[t, len(order):] = path[t], -1e30
        b = parent
    return BeamResult(path, top, sc, rows_run)
