"""A retrieval datastore of public text on the local side: a token suffix array (for ``rest`` and ``suffix-automaton``).

REST (He et al. 2023, "REST: Retrieval-Based Speculative Decoding", arXiv
2311.08252) drafts from continuations of the context's longest suffix that
occurs in a datastore of text. The datastore here is a token array of public
documents (the ``train`` split of the project's corpora, tokenised with the
model's tokenizer; documents separated by -1) and its suffix array over the
first ``width`` tokens of every suffix, as ``width`` sorted columns, so a
pattern of up to ``width`` tokens is found by narrowing a row range column by
column (``np.searchsorted``, O(m log N)).

Deviations from REST: the suffix array compares only the first ``width``
tokens (REST's matches are capped at 16 tokens as well), and the datastore is
built in memory per process from corpora (REST loads a prebuilt array); it is
cached per (tokenizer, corpora, size).

Pure core: :class:`Datastore` works on token ids alone; :func:`corpus_datastore`
is the only part that reads text.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from splitinfer.errors import SplitInferError

log = logging.getLogger(__name__)

SEP = -1  # document separator in the token array


class Datastore:
    """Token ids of many documents and their suffix array over ``width`` tokens."""

    def __init__(self, documents: Sequence[Sequence[int]], width: int = 16):
        if width < 2:
            raise SplitInferError(f"datastore width must be >= 2, got {width}")
        self.width = width
        parts = []
        for doc in documents:
            if len(doc):
                parts += [np.asarray(doc, dtype=np.int32), np.array([SEP], dtype=np.int32)]
        tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)  # (N,)
        self.n = int(tokens.size)
        self.padded = np.concatenate([tokens, np.full(width + 1, SEP, dtype=np.int32)])  # (N + width + 1,)
        windows = np.lib.stride_tricks.sliding_window_view(self.padded, width)[: self.n]  # (N, width) view
        self.order = np.lexsort(windows.T[::-1]) if self.n else np.zeros(0, dtype=np.int64)  # (N,) sorted suffixes
        self.cols = [self.padded[self.order + j] for j in range(width)]  # width x (N,) sorted columns

    def __len__(self) -> int:
        return self.n

    def find(self, pattern: Sequence[int]) -> tuple[int, int]:
        """Row range [lo, hi) of the suffix array whose suffixes start with ``pattern`` (len <= width)."""
        lo, hi = 0, self.n
        for j, t in enumerate(pattern):
            col = self.cols[j]
            lo, hi = lo + int(np.searchsorted(col[lo:hi], t, "left")), lo + int(np.searchsorted(col[lo:hi], t, "right"))
            if lo >= hi:
                break
        return lo, hi

    def longest_match(self, context: Sequence[int], max_match: int) -> tuple[int, np.ndarray]:
        """(m, start positions) of the longest context suffix (m <= max_match, width - 1) that occurs with a
        continuation; (0, empty) when none does."""
        if not self.n:
            return 0, np.zeros(0, dtype=np.int64)
        for m in range(min(max_match, self.width - 1, len(context)), 0, -1):
            pattern = [int(t) for t in context[len(context) - m :]]
            if SEP in pattern:
                continue
            lo, hi = self.find(pattern)
            if lo < hi:
                nxt = self.cols[m][lo:hi]
                starts = self.order[lo:hi][nxt != SEP]
                if starts.size:
                    return m, starts
        return 0, np.zeros(0, dtype=np.int64)

    def continuations(self, starts: np.ndarray, m: int, depth: int, max_samples: int) -> list[list[int]]:
        """Up to ``depth`` tokens following each match (the first ``max_samples`` matches), cut at separators."""
        out = []
        for p in np.sort(starts)[:max_samples]:
            seq = self.padded[p + m : p + m + depth].tolist()
            cut = seq.index(SEP) if SEP in seq else len(seq)
            if cut:
                out.append(seq[:cut])
        return out


def count_tree(seqs: Sequence[Sequence[int]], budget: int,
               min_prob: float = 0.0) -> list[tuple[int, int, float, float]]:
    """REST's trie of retrieved continuations, best nodes first: (token, parent index, path prob, cond prob).

    A node's conditional probability is its count over its parent's; nodes are taken best-first by path
    probability (parents always before children) up to ``budget`` and down to ``min_prob``.
    """
    children: dict[tuple[int, ...], dict[int, int]] = {}
    for s in seqs:
        for k in range(len(s)):
            kids = children.setdefault(tuple(s[:k]), {})
            kids[s[k]] = kids.get(s[k], 0) + 1
    out: list[tuple[int, int, float, float]] = []
    heap: list[tuple[float, int, tuple[int, ...], int, float]] = []  # (-path prob, depth, path, parent, cond)

    def push(path: tuple[int, ...], parent: int, prob: float) -> None:
        kids = children.get(path, {})
        total = sum(kids.values())
        for tok, c in kids.items():
            if prob * c / total >= min_prob:
                heapq.heappush(heap, (-prob * c / total, len(path) + 1, (*path, tok), parent, c / total))

    push((), -1, 1.0)
    while heap and len(out) < budget:
        neg, _, path, parent, cond = heapq.heappop(heap)
        out.append((path[-1], parent, -neg, cond))
        push(path, len(out) - 1, -neg)
    return out


@lru_cache(maxsize=4)
def _cached(tokenizer, corpora: tuple[str, ...], max_tokens: int, width: int) -> Datastore:
    from splitinfer.corpora import load_corpus
    from splitinfer.tokens import encode_text

    docs: list[list[int]] = []
    per = max_tokens // max(1, len(corpora))
    for name in corpora:
        got = 0
        for text in load_corpus(name, "train", tokenizer=tokenizer)["text"]:
            if got >= per:
                break
            ids = list(encode_text(tokenizer, text).ids)[: per - got]
            docs.append(ids)
            got += len(ids)
    store = Datastore(docs, width)
    log.info("datastore of %d tokens from %s (train splits)", len(store), ",".join(corpora))
    return store


def corpus_datastore(tokenizer, corpora: str, max_tokens: int, width: int = 16) -> Datastore:
    """The datastore of up to ``max_tokens`` tokens of the ``train`` splits of ``corpora`` (a comma list), shared
    equally and read in document order; cached per process. Empty when ``tokenizer`` is None (a replay without one)."""
    names = tuple(c.strip() for c in str(corpora).split(",") if c.strip())
    if tokenizer is None or not names or max_tokens <= 0:
        return Datastore([], width)
    return _cached(tokenizer, names, int(max_tokens), int(width))


def ensure_store(store: Datastore | None, env, corpora: str, max_tokens: int, max_match: int) -> Datastore:
    """A proposer's datastore: ``store`` if built, else built now from the run's tokenizer (``env.tokenizer``)."""
    if store is not None:
        return store
    return corpus_datastore(getattr(env, "tokenizer", None), corpora, max_tokens, width=max_match + 1)
