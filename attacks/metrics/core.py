"""Core attack metrics: pure functions on token ids, one entry per document (DESIGN.md §5).

* :func:`token_accuracy_topk` -- per-document (correct, total) token counts;
  the true token counts as recovered when it is among the attacker's first
  ``k`` guesses.  Aggregated over tokens (micro average).
* :func:`token_f1` -- bag-of-tokens (multiset) F1 per document (macro average).
* :func:`exact_match` -- whether each document was recovered entirely.
* :func:`pii_recovery_per_doc` -- PII spans recovered character-exactly,
  per PII type and document (sum over documents for totals) (see :func:`pii_spans_recovered`
  for the criterion used on token-level predictions).

Baselines are in :mod:`attacks.metrics.baselines`, intervals in
:mod:`attacks.metrics.intervals`, the summary in :mod:`attacks.metrics.summary`.
Bad inputs (mismatched lengths, ``k < 1``, no documents) raise ``ValueError``
with a message naming the bad value.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------
# input checking
# --------------------------------------------------------------------------


def as_ids(x: ArrayLike, what: str) -> np.ndarray:
    """A 1-D int64 array of token ids, or ValueError naming ``what``."""
    arr = np.asarray(x)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be a 1-D sequence of token ids, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} must hold integer token ids, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def as_topk(x: ArrayLike, n_tokens: int, what: str) -> np.ndarray:
    """A (T, K) int64 array of ranked guesses; a 1-D (T,) input means K = 1."""
    arr = np.asarray(x)
    if arr.size == 0 and n_tokens == 0:
        return np.zeros((0, arr.shape[-1] if arr.ndim == 2 else 1), dtype=np.int64)
    if arr.ndim == 1:
        arr = arr[:, None]  # (T, 1)
    if arr.ndim != 2:
        raise ValueError(f"{what} must have shape (T, k), got {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} must hold integer token ids, got dtype {arr.dtype}")
    if arr.shape[0] != n_tokens:
        raise ValueError(
            f"{what} has {arr.shape[0]} positions but the true sequence has {n_tokens}"
        )
    return arr.astype(np.int64, copy=False)


def check_docs(a: Sequence[Any], b: Sequence[Any], a_name: str, b_name: str) -> int:
    """Number of documents, checking both sequences hold the same non-zero count."""
    if len(a) == 0:
        raise ValueError(f"{a_name} is empty: metrics need at least one document")
    if len(a) != len(b):
        raise ValueError(
            f"{a_name} has {len(a)} documents but {b_name} has {len(b)}; "
            "pass one entry per document in both"
        )
    return len(a)


def check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    return int(k)


# --------------------------------------------------------------------------
# per-document metrics
# --------------------------------------------------------------------------


def token_accuracy_topk(
    true_ids: Sequence[ArrayLike], topk_ids: Sequence[ArrayLike], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-document counts of positions whose true token is in the first ``k`` guesses.

    Args:
        true_ids: one 1-D array of true token ids per document, shape ``(T,)``.
        topk_ids: one array of ranked guesses per document, shape ``(T, K)``
            (best guess first); a 1-D ``(T,)`` array is a single guess.
        k: how many guesses count; must satisfy ``1 <= k <= K``.

    Returns:
        ``(correct, total)``: two int64 arrays of shape ``(n_docs,)``.
        Accuracy@k is ``correct.sum() / total.sum()``.
    """
    k = check_k(k)
    check_docs(true_ids, topk_ids, "true_ids", "topk_ids")
    correct = np.zeros(len(true_ids), dtype=np.int64)
    total = np.zeros(len(true_ids), dtype=np.int64)
    for i, (t, g) in enumerate(zip(true_ids, topk_ids)):
        t = as_ids(t, f"true_ids[{i}]")
        g = as_topk(g, len(t), f"topk_ids[{i}]")
        if g.shape[1] < k and len(t):
            raise ValueError(
                f"topk_ids[{i}] holds {g.shape[1]} guesses per position, fewer than k={k}"
            )
        correct[i] = int((g[:, :k] == t[:, None]).any(axis=1).sum())
        total[i] = len(t)
    return correct, total


def _multiset_overlap(a: np.ndarray, b: np.ndarray) -> int:
    """Size of the multiset intersection of two id arrays."""
    ua, ca = np.unique(a, return_counts=True)
    ub, cb = np.unique(b, return_counts=True)
    _, ia, ib = np.intersect1d(ua, ub, assume_unique=True, return_indices=True)
    return int(np.minimum(ca[ia], cb[ib]).sum())


def token_f1(true_ids: Sequence[ArrayLike], pred_ids: Sequence[ArrayLike]) -> np.ndarray:
    """Bag-of-tokens (multiset) F1 between recovered and true ids, per document.

    precision = |true ∩ pred| / |pred|, recall = |true ∩ pred| / |true| with
    multiset intersection; F1 = 2PR / (P + R), 0 when nothing overlaps.  Two
    empty documents score 1.0; one empty and one not score 0.0.  Order is
    ignored, and the two sequences may differ in length.

    Returns:
        float64 array of shape ``(n_docs,)`` with values in [0, 1].
    """
    check_docs(true_ids, pred_ids, "true_ids", "pred_ids")
    out = np.zeros(len(true_ids), dtype=np.float64)
    for i, (t, p) in enumerate(zip(true_ids, pred_ids)):
        t = as_ids(t, f"true_ids[{i}]")
        p = as_ids(p, f"pred_ids[{i}]")
        if len(t) == 0 and len(p) == 0:
            out[i] = 1.0
            continue
        overlap = _multiset_overlap(t, p)
        # 2PR/(P+R) simplifies to 2*overlap / (|t| + |p|)
        out[i] = 2.0 * overlap / (len(t) + len(p))
    return out


def exact_match(true_ids: Sequence[ArrayLike], pred_ids: Sequence[ArrayLike]) -> np.ndarray:
    """Whether each document was recovered entirely (same length, every id equal).

    Returns:
        bool array of shape ``(n_docs,)``.
    """
    check_docs(true_ids, pred_ids, "true_ids", "pred_ids")
    out = np.zeros(len(true_ids), dtype=bool)
    for i, (t, p) in enumerate(zip(true_ids, pred_ids)):
        t = as_ids(t, f"true_ids[{i}]")
        p = as_ids(p, f"pred_ids[{i}]")
        out[i] = len(t) == len(p) and bool(np.array_equal(t, p))
    return out


# --------------------------------------------------------------------------
# PII spans
# --------------------------------------------------------------------------


def _span(span: Mapping[str, Any], where: str) -> tuple[int, int, str]:
    try:
        start, end, kind = span["start"], span["end"], span["type"]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{where} must be a dict with 'start', 'end' and 'type', got {span!r}") from exc
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"{where}['type'] must be a non-empty string, got {kind!r}")
    ok = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (start, end))
    if not ok or not 0 <= start < end:
        raise ValueError(f"{where} needs integer 0 <= start < end, got start={start!r} end={end!r}")
    return int(start), int(end), kind


def pii_spans_recovered(
    true_ids: ArrayLike,
    pred_ids: ArrayLike,
    offsets: ArrayLike,
    spans: Sequence[Mapping[str, Any]],
) -> list[bool | None]:
    """Which PII spans of ONE document the attacker recovered character-exactly.

    Criterion (character-exact under the true tokenization): a span
    ``[start, end)`` of the true text counts as recovered iff every token
    whose character range overlaps it is predicted correctly (top-1).
    Decoding the predictions then reproduces the span's characters exactly.
    This is sufficient for character-exact recovery; where a span boundary
    falls inside a token it is slightly strict, since the whole boundary token
    must be right.

    A span that the tokens do not cover (the document was truncated before
    the span ends, or the window starts after it) cannot be scored and gives
    ``None``.  Tokens with an empty character range (special tokens, offset
    ``(0, 0)``) never overlap a span.

    Args:
        true_ids: true token ids, shape ``(T,)``.
        pred_ids: predicted top-1 ids, shape ``(T,)`` (or ``(T, k)``: column 0 is used).
        offsets: per-token ``(char_start, char_end)`` of the true text, shape
            ``(T, 2)`` -- a fast tokenizer's ``offset_mapping``.
        spans: dicts with integer ``start``, ``end`` (exclusive) and str ``type``.

    Returns:
        One entry per span: True (recovered), False (not), None (not scorable).
    """
    t = as_ids(true_ids, "true_ids")
    p = as_topk(pred_ids, len(t), "pred_ids")[:, 0]
    off = np.asarray(offsets)
    if off.size == 0 and len(t) == 0:
        off = np.zeros((0, 2), dtype=np.int64)
    if off.ndim != 2 or off.shape != (len(t), 2):
        raise ValueError(f"offsets must have shape ({len(t)}, 2), got {off.shape}")
    starts, ends = off[:, 0], off[:, 1]  # (T,), (T,)
    real = ends > starts  # (T,) tokens with a non-empty character range
    correct = t == p  # (T,)
    lo = int(starts[real].min()) if real.any() else 0
    hi = int(ends[real].max()) if real.any() else 0
    out: list[bool | None] = []
    for j, span in enumerate(spans):
        s, e, _ = _span(span, f"spans[{j}]")
        overlap = real & (starts < e) & (ends > s)  # (T,)
        if not overlap.any() or s < lo or e > hi:
            logger.debug("PII span [%d, %d) is not covered by the tokens; not scored", s, e)
            out.append(None)
        else:
            out.append(bool(correct[overlap].all()))
    return out


def pii_recovery_per_doc(
    true_ids: Sequence[ArrayLike],
    pred_ids: Sequence[ArrayLike],
    offsets: Sequence[ArrayLike],
    spans: Sequence[Sequence[Mapping[str, Any]]],
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per-type, per-document (recovered, total) counts of PII spans.

    All arguments hold one entry per document (see :func:`pii_spans_recovered`
    for the per-document inputs and the recovery criterion).  Spans that
    cannot be scored are left out of ``total``.

    Returns:
        ``{type: (recovered, total)}`` with two int64 arrays of shape ``(n_docs,)``.
    """
    n = check_docs(true_ids, pred_ids, "true_ids", "pred_ids")
    check_docs(true_ids, offsets, "true_ids", "offsets")
    check_docs(true_ids, spans, "true_ids", "spans")
    counts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    skipped = 0
    for i in range(n):
        try:
            hits = pii_spans_recovered(true_ids[i], pred_ids[i], offsets[i], spans[i])
        except ValueError as exc:
            raise ValueError(f"document {i}: {exc}") from exc
        for span, hit in zip(spans[i], hits):
            kind = span["type"]
            rec, tot = counts.setdefault(kind, (np.zeros(n, np.int64), np.zeros(n, np.int64)))
            if hit is None:
                skipped += 1
                continue
            tot[i] += 1
            rec[i] += int(hit)
    if skipped:
        logger.debug("%d PII span(s) lie outside the tokenized text and were not scored", skipped)
    return counts

