"""In-memory activation taps for the attackers.

:class:`Taps` is what every :class:`~attacks.base.InversionAttack` consumes:
per-token hidden states, token ids and character offsets, with sequences
stored back to back (positions restart at 0 at each sequence) and each
sequence tied to a document (for document-level metrics and bootstrap CIs).
:func:`as_taps` turns an on-disk :class:`~attacks.tapstore.TapSet` (issue 5's
cache), a list of them, or a :class:`Taps` into one :class:`Taps` without
copying the memory-mapped hidden states when it can.

Taps are computed by the one extractor of :mod:`attacks.taps`: on disk and
cached (:func:`~attacks.taps.extract_taps`) or in memory at several depths in
one forward (:func:`~attacks.taps.extract_depths`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attacks.errors import AttackError

log = logging.getLogger(__name__)

__all__ = ["Taps", "as_taps"]


@dataclass
class Taps:
    """Hidden states at one boundary for a set of sequences, with their tokens and documents."""

    hidden: np.ndarray  # (N, d) float16 / float32 (may be a read-only memmap)
    token_ids: np.ndarray  # (N,) int64
    seq_lengths: np.ndarray  # (S,) int64; sum == N
    seq_doc: np.ndarray  # (S,) int64 index into ``documents``
    documents: list[dict[str, Any]]  # {doc_id, genre, text, pii_spans, template_spans}
    offsets: np.ndarray | None = None  # (N, 2) int32 char range in the document text
    meta: dict[str, Any] = field(default_factory=dict)  # model, model_sha256, boundary, depth, num_layers, ...

    def __post_init__(self) -> None:
        self.token_ids = np.asarray(self.token_ids, dtype=np.int64).reshape(-1)
        self.seq_lengths = np.asarray(self.seq_lengths, dtype=np.int64).reshape(-1)
        self.seq_doc = np.asarray(self.seq_doc, dtype=np.int64).reshape(-1)
        n = len(self.token_ids)
        if self.hidden.ndim != 2 or self.hidden.shape[0] != n:
            raise AttackError(f"taps hold {n} token ids but hidden states of shape {tuple(self.hidden.shape)}; "
                              "expected (N, d) with one row per token")
        if int(self.seq_lengths.sum()) != n or (self.seq_lengths < 1).any():
            raise AttackError(f"taps sequence lengths sum to {int(self.seq_lengths.sum())}, not {n} tokens (or a "
                              "sequence is empty); rebuild the taps")
        if len(self.seq_doc) != len(self.seq_lengths) or (
                len(self.seq_doc) and (self.seq_doc.min() < 0 or self.seq_doc.max() >= len(self.documents))):
            raise AttackError("taps sequence->document map is inconsistent with the document list; rebuild the taps")
        if self.offsets is not None and self.offsets.shape != (n, 2):
            raise AttackError(f"taps offsets have shape {tuple(self.offsets.shape)}, expected ({n}, 2)")

    # ------------------------------------------------------------ metadata
    @property
    def n_tokens(self) -> int:
        return int(len(self.token_ids))

    @property
    def hidden_size(self) -> int:
        return int(self.hidden.shape[1])

    @property
    def boundary(self) -> str | None:
        return self.meta.get("boundary")

    @property
    def model_sha256(self) -> str | None:
        return self.meta.get("model_sha256")

    def __len__(self) -> int:
        return int(len(self.seq_lengths))

    def __repr__(self) -> str:
        return (f"Taps(boundary={self.boundary}, sequences={len(self)}, tokens={self.n_tokens}, "
                f"documents={len(set(self.seq_doc.tolist()))}, d={self.hidden.shape[1]})")

    # ------------------------------------------------------------ per-token helpers
    def seq_starts(self) -> np.ndarray:
        """(S + 1,) start row of each sequence, then N."""
        return np.concatenate([[0], np.cumsum(self.seq_lengths)]).astype(np.int64)

    def positions(self) -> np.ndarray:
        """(N,) position of each token within its sequence."""
        starts = self.seq_starts()
        return np.arange(self.n_tokens, dtype=np.int64) - np.repeat(starts[:-1], self.seq_lengths)

    def sequence_index(self) -> np.ndarray:
        """(N,) index of each token's sequence."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.seq_lengths)

    def doc_index(self) -> np.ndarray:
        """(N,) index of each token's document in ``documents``."""
        return np.repeat(self.seq_doc, self.seq_lengths)

    def next_token_ids(self, fill: int = -100) -> np.ndarray:
        """(N,) the token after each token in its sequence; ``fill`` at each sequence's last position."""
        nxt = np.full(self.n_tokens, fill, dtype=np.int64)
        nxt[:-1] = self.token_ids[1:]
        nxt[self.seq_starts()[1:] - 1] = fill
        return nxt

    def sequences(self) -> Iterable[tuple[int, slice]]:
        """(sequence index, row slice) for each sequence."""
        starts = self.seq_starts()
        for s in range(len(self)):
            yield s, slice(int(starts[s]), int(starts[s + 1]))

    # ------------------------------------------------------------ subsets
    def select_sequences(self, indices: Sequence[int]) -> Taps:
        """A copy holding only the given sequences (in the given order)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size == 0:
            raise AttackError("cannot select zero sequences from taps: the result would be empty")
        starts = self.seq_starts()
        rows = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in idx])
        return Taps(np.asarray(self.hidden[rows]), self.token_ids[rows], self.seq_lengths[idx], self.seq_doc[idx],
                    self.documents, None if self.offsets is None else self.offsets[rows], dict(self.meta))

    def select_tokens(self, rows: Sequence[int]) -> Taps:
        """A copy holding the given token rows, each as its own one-token sequence (for token-level protocols)."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size == 0:
            raise AttackError("cannot select zero tokens from taps: the result would be empty")
        return Taps(np.asarray(self.hidden[rows]), self.token_ids[rows], np.ones(rows.size, dtype=np.int64),
                    self.doc_index()[rows], self.documents, None if self.offsets is None else self.offsets[rows],
                    dict(self.meta))

    def truncate(self, max_len: int) -> Taps:
        """A copy keeping the first ``max_len`` tokens of every sequence (valid prefixes: positions start at 0)."""
        if max_len < 1:
            raise AttackError(f"max_len={max_len} must be >= 1")
        starts = self.seq_starts()
        lens = np.minimum(self.seq_lengths, max_len)
        rows = np.concatenate([np.arange(starts[i], starts[i] + lens[i]) for i in range(len(self))])
        return Taps(np.asarray(self.hidden[rows]), self.token_ids[rows], lens, self.seq_doc, self.documents,
                    None if self.offsets is None else self.offsets[rows], dict(self.meta))

    def head_tokens(self, max_tokens: int) -> Taps:
        """The first whole sequences holding at most ``max_tokens`` tokens (at least one sequence)."""
        keep = int(np.searchsorted(np.cumsum(self.seq_lengths), max_tokens, side="right"))
        return self if keep >= len(self) else self.select_sequences(range(max(keep, 1)))

    def spread_tokens(self, max_tokens: int) -> Taps:
        """Whole sequences spread over the taps in proportion, holding at most ``max_tokens`` tokens (at least one).

        In order, each sequence adds its share of the budget (its length x ``max_tokens`` / total) to a running
        quota and is taken when the quota covers its length, which then pays for it: every stretch of the pool
        gives about its share, within one sequence, and the sample never passes the budget. A training pool is
        concatenated corpus by corpus, so :meth:`head_tokens` of it is the first corpus alone.
        """
        lengths = self.seq_lengths.astype(np.int64)
        total = int(lengths.sum())
        if total <= max_tokens:
            return self
        rate, quota, chosen = max(0, max_tokens) / total, 0.0, []
        for i, n in enumerate(lengths.tolist()):
            quota += n * rate
            if quota + 1e-9 >= n:
                chosen.append(i)
                quota -= n
        return self.select_sequences(chosen or [0])

    @classmethod
    def concat(cls, parts: Sequence[Taps]) -> Taps:
        """Concatenate taps of the same model and boundary (documents are kept apart)."""
        parts = list(parts)
        if not parts:
            raise AttackError("no taps to concatenate: the corpus list is empty")
        if len(parts) == 1:
            return parts[0]
        for key in ("model_sha256", "boundary"):
            values = {p.meta.get(key) for p in parts}
            if len(values) > 1:
                raise AttackError(f"cannot concatenate taps with different {key}: {sorted(map(str, values))}; "
                                  "extract every corpus with the same model and boundary")
        docs: list[dict[str, Any]] = []
        seq_doc = []
        for p in parts:
            seq_doc.append(p.seq_doc + len(docs))
            docs.extend(p.documents)
        offsets = None if any(p.offsets is None for p in parts) else np.concatenate([p.offsets for p in parts])
        meta = dict(parts[0].meta)
        meta["corpus"] = ",".join(dict.fromkeys(str(p.meta.get("corpus", "?")) for p in parts))
        return cls(np.concatenate([np.asarray(p.hidden) for p in parts]), np.concatenate([p.token_ids for p in parts]),
                   np.concatenate([p.seq_lengths for p in parts]), np.concatenate(seq_doc), docs, offsets, meta)


def _from_tapset(ts: Any) -> Taps:
    """A :class:`Taps` view of an :class:`attacks.tapstore.TapSet` (hidden states stay memory-mapped if contiguous)."""
    chunks = ts.chunks
    if not chunks:
        raise AttackError(f"tap set {ts.path} selects no sequences: the corpus is empty; pick a corpus with text")
    index_docs = ts.index["documents"]
    local: dict[int, int] = {}
    for c in chunks:
        local.setdefault(int(c["doc"]), len(local))
    documents = [{k: index_docs[d].get(k) for k in ("doc_id", "genre", "text", "pii_spans", "template_spans")}
                 for d in local]
    meta = {k: ts.index.get(k) for k in ("model", "model_sha256", "boundary", "depth", "num_layers", "hidden_size",
                                         "corpus", "split", "kind")}
    return Taps(ts.hidden(), ts.token_ids(), [c["length"] for c in chunks], [local[int(c["doc"])] for c in chunks],
                documents, np.asarray(ts.offsets()), meta)


def as_taps(data: Any) -> Taps:
    """:class:`Taps` from a Taps, a TapSet, or a list/tuple of either (concatenated)."""
    if isinstance(data, Taps):
        if data.n_tokens == 0:
            raise AttackError("the taps are empty (0 tokens); pick a corpus with text")
        return data
    if isinstance(data, (list, tuple)):
        return Taps.concat([as_taps(d) for d in data])
    if hasattr(data, "chunks") and hasattr(data, "index") and hasattr(data, "hidden"):
        return _from_tapset(data)
    raise AttackError(f"expected taps (attacks.tapdata.Taps or attacks.tapstore.TapSet), got {type(data).__name__}")
