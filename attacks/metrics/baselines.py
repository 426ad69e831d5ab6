"""Baselines: what an attacker who ignores the activations gets (issue 14 item 3).

* :func:`uniform_baseline` -- guessing ``k`` tokens uniformly.
* :func:`unigram_prior_hits` -- always the ``k`` most frequent training tokens.
* :class:`TokenPrior` -- the unigram prior and the *position-conditioned*
  prior (the cloud knows each token's position: the ``k`` most frequent
  training tokens at that position), as per-token guesses, so the baselines
  are scored with the same metrics as an attack (token accuracy, exact match,
  PII), and the training vocabulary for :func:`coverage`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from attacks.metrics.core import as_ids, check_k

def uniform_baseline(vocab_size: int, k: int = 1) -> float:
    """Accuracy@k of guessing ``k`` distinct tokens uniformly: ``min(k, |V|) / |V|``."""
    k = check_k(k)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 1:
        raise ValueError(f"vocab_size must be an integer >= 1, got {vocab_size!r}")
    return min(k, int(vocab_size)) / int(vocab_size)


def _flatten(ids: Sequence[ArrayLike] | ArrayLike, what: str) -> np.ndarray:
    """All token ids of ``ids`` (one flat array, or one array per document) as 1-D int64."""
    if isinstance(ids, np.ndarray) or not isinstance(ids, Sequence):
        return as_ids(np.asarray(ids).reshape(-1), what)
    if len(ids) == 0:
        return np.zeros(0, dtype=np.int64)
    if np.ndim(ids[0]) == 0:  # a flat list of ids
        return as_ids(np.asarray(ids), what)
    return np.concatenate([as_ids(d, f"{what}[{i}]") for i, d in enumerate(ids)])


def unigram_prior_hits(
    train_token_ids: Sequence[ArrayLike] | ArrayLike,
    test_token_ids: Sequence[ArrayLike],
    k: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-test-document (hits, total) of always guessing the k most frequent train tokens.

    Ties in train frequency go to the smaller token id, so the guess set is
    deterministic.

    Args:
        train_token_ids: training tokens, one array per document or one flat array.
        test_token_ids: one 1-D array per test document.
        k: size of the guess set.

    Returns:
        ``(hits, total)``: int64 arrays of shape ``(n_test_docs,)``.
    """
    k = check_k(k)
    train = _flatten(train_token_ids, "train_token_ids")
    if len(train) == 0:
        raise ValueError("train_token_ids is empty: the unigram prior needs training tokens")
    if len(test_token_ids) == 0:
        raise ValueError("test_token_ids is empty: metrics need at least one document")
    uniq, counts = np.unique(train, return_counts=True)  # uniq ascending
    order = np.lexsort((uniq, -counts))  # by count desc, then id asc
    guesses = uniq[order[:k]]
    hits = np.zeros(len(test_token_ids), dtype=np.int64)
    total = np.zeros(len(test_token_ids), dtype=np.int64)
    for i, d in enumerate(test_token_ids):
        d = as_ids(d, f"test_token_ids[{i}]")
        hits[i] = int(np.isin(d, guesses).sum())
        total[i] = len(d)
    return hits, total


def unigram_prior_baseline(
    train_token_ids: Sequence[ArrayLike] | ArrayLike,
    test_token_ids: Sequence[ArrayLike],
    k: int = 1,
) -> float:
    """Share of test tokens among the ``k`` most frequent training tokens."""
    hits, total = unigram_prior_hits(train_token_ids, test_token_ids, k)
    if total.sum() == 0:
        raise ValueError("test_token_ids holds no tokens")
    return float(hits.sum() / total.sum())


def _top_ids(ids: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` most frequent ids (ties to the smaller id), most frequent first."""
    uniq, counts = np.unique(ids, return_counts=True)  # uniq ascending
    return uniq[np.lexsort((uniq, -counts))[:k]]


@dataclass(frozen=True)
class TokenPrior:
    """Guesses that need no activation: the unigram and the position-conditioned prior of the training tokens.

    ``unigram`` is (K,) the most frequent training tokens; ``by_position`` is
    (P, K): row ``p`` the most frequent training tokens at sequence position
    ``p`` (padded with the unigram guesses where a position has fewer than K
    distinct tokens); positions past P fall back to the unigram guesses.
    ``vocab`` is the sorted set of training token ids (for :func:`coverage`).
    """

    unigram: np.ndarray  # (K,)
    by_position: np.ndarray  # (P, K)
    vocab: np.ndarray  # (V_train,)

    @classmethod
    def fit(cls, token_ids: ArrayLike, positions: ArrayLike | None = None, k: int = 5) -> TokenPrior:
        """From flat training token ids (N,) and their positions (N,) in their sequences (None: no position prior)."""
        k = check_k(k)
        ids = _flatten(token_ids, "train_token_ids")
        if len(ids) == 0:
            raise ValueError("train_token_ids is empty: the priors need training tokens")
        uni = _top_ids(ids, k)
        uni = np.concatenate([uni, np.full(k - len(uni), uni[0])])  # (K,) even with < K distinct tokens
        if positions is None:
            return cls(uni, np.zeros((0, k), dtype=np.int64), np.unique(ids))
        pos = as_ids(np.asarray(positions).reshape(-1), "train positions")
        if len(pos) != len(ids):
            raise ValueError(f"{len(pos)} training positions for {len(ids)} training tokens; pass one per token")
        table = np.empty((int(pos.max()) + 1, k), dtype=np.int64)  # (P, K)
        for p in range(len(table)):
            top = _top_ids(ids[pos == p], k) if (pos == p).any() else np.zeros(0, dtype=np.int64)
            rest = [u for u in uni if u not in set(top.tolist())]
            table[p] = np.concatenate([top, rest])[:k]
        return cls(uni, table, np.unique(ids))

    @property
    def has_positions(self) -> bool:
        return len(self.by_position) > 0

    def unigram_guesses(self, n_tokens: int) -> np.ndarray:
        """(T, K) the unigram guesses at every position."""
        return np.broadcast_to(self.unigram, (n_tokens, len(self.unigram)))

    def position_guesses(self, positions: ArrayLike) -> np.ndarray:
        """(T, K) the position prior's guesses for tokens at ``positions`` (T,)."""
        pos = as_ids(np.asarray(positions).reshape(-1), "positions")
        out = self.unigram_guesses(len(pos)).copy()  # (T, K)
        known = pos < len(self.by_position)
        out[known] = self.by_position[pos[known]]
        return out


def coverage(prior: TokenPrior, test_token_ids: Sequence[ArrayLike]) -> tuple[np.ndarray, np.ndarray]:
    """Per-document (seen, total): test tokens whose id occurs in training (a closed-vocabulary attacker's ceiling)."""
    seen = np.zeros(len(test_token_ids), dtype=np.int64)
    total = np.zeros(len(test_token_ids), dtype=np.int64)
    for i, d in enumerate(test_token_ids):
        d = as_ids(d, f"test_token_ids[{i}]")
        seen[i] = int(np.isin(d, prior.vocab).sum())
        total[i] = len(d)
    return seen, total


def prior_to_json(prior: TokenPrior) -> dict:
    """A JSON-able form of ``prior`` (for checkpoints and prediction files)."""
    return {"unigram": prior.unigram.tolist(), "by_position": prior.by_position.tolist(), "vocab": prior.vocab.tolist()}


def prior_from_json(obj: dict) -> TokenPrior:
    """The inverse of :func:`prior_to_json`."""
    k = len(obj["unigram"])
    return TokenPrior(np.asarray(obj["unigram"], dtype=np.int64),
                      np.asarray(obj["by_position"], dtype=np.int64).reshape(-1, k),
                      np.asarray(obj["vocab"], dtype=np.int64))
