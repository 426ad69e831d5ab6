"""Metrics for inversion attacks: pure functions on token ids (DESIGN.md §5).

Every function here works on plain Python / numpy inputs, one entry per
*document*, so that confidence intervals can be bootstrapped over documents:

* :func:`token_accuracy_topk` -- per-document (correct, total) token counts;
  the true token counts as recovered when it is among the attacker's first
  ``k`` guesses.  Aggregated over tokens (micro average).
* :func:`token_f1` -- bag-of-tokens (multiset) F1 per document.  Aggregated
  as the mean over documents (macro average).
* :func:`exact_match` -- whether each document was recovered entirely.
* :func:`pii_recovery` / :func:`pii_recovery_per_doc` -- share of PII spans
  recovered character-exactly, per PII type (see :func:`pii_spans_recovered`
  for the criterion used on token-level predictions).
* :func:`uniform_baseline` and :func:`unigram_prior_baseline` -- what an
  attacker who ignores the activations gets.
* :func:`bootstrap_ci` -- percentile bootstrap CI of a ratio-of-sums metric,
  resampling documents with replacement.
* :func:`summarize` -- all of the above as ``{metric: {value, ci_low,
  ci_high, n, higher_is_better, kind}}``, the shape of DESIGN.md §7.

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

__all__ = [
    "bootstrap_ci",
    "exact_match",
    "pii_recovery",
    "pii_recovery_per_doc",
    "pii_spans_recovered",
    "summarize",
    "token_accuracy_topk",
    "token_f1",
    "uniform_baseline",
    "unigram_prior_baseline",
    "unigram_prior_hits",
]

# Upper bound on resampled indices held in memory at once by bootstrap_ci.
_MAX_BOOT_DRAWS = 4_000_000


# --------------------------------------------------------------------------
# input checking
# --------------------------------------------------------------------------


def _ids(x: ArrayLike, what: str) -> np.ndarray:
    """A 1-D int64 array of token ids, or ValueError naming ``what``."""
    arr = np.asarray(x)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be a 1-D sequence of token ids, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} must hold integer token ids, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _topk(x: ArrayLike, n_tokens: int, what: str) -> np.ndarray:
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


def _check_docs(a: Sequence[Any], b: Sequence[Any], a_name: str, b_name: str) -> int:
    """Number of documents, checking both sequences hold the same non-zero count."""
    if len(a) == 0:
        raise ValueError(f"{a_name} is empty: metrics need at least one document")
    if len(a) != len(b):
        raise ValueError(
            f"{a_name} has {len(a)} documents but {b_name} has {len(b)}; "
            "pass one entry per document in both"
        )
    return len(a)


def _check_k(k: int) -> int:
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
    k = _check_k(k)
    _check_docs(true_ids, topk_ids, "true_ids", "topk_ids")
    correct = np.zeros(len(true_ids), dtype=np.int64)
    total = np.zeros(len(true_ids), dtype=np.int64)
    for i, (t, g) in enumerate(zip(true_ids, topk_ids)):
        t = _ids(t, f"true_ids[{i}]")
        g = _topk(g, len(t), f"topk_ids[{i}]")
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
    _check_docs(true_ids, pred_ids, "true_ids", "pred_ids")
    out = np.zeros(len(true_ids), dtype=np.float64)
    for i, (t, p) in enumerate(zip(true_ids, pred_ids)):
        t = _ids(t, f"true_ids[{i}]")
        p = _ids(p, f"pred_ids[{i}]")
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
    _check_docs(true_ids, pred_ids, "true_ids", "pred_ids")
    out = np.zeros(len(true_ids), dtype=bool)
    for i, (t, p) in enumerate(zip(true_ids, pred_ids)):
        t = _ids(t, f"true_ids[{i}]")
        p = _ids(p, f"pred_ids[{i}]")
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
    t = _ids(true_ids, "true_ids")
    p = _topk(pred_ids, len(t), "pred_ids")[:, 0]
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
    n = _check_docs(true_ids, pred_ids, "true_ids", "pred_ids")
    _check_docs(true_ids, offsets, "true_ids", "offsets")
    _check_docs(true_ids, spans, "true_ids", "spans")
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
        logger.warning("%d PII span(s) lie outside the tokenized text and were not scored", skipped)
    return counts


def pii_recovery(
    true_ids: Sequence[ArrayLike],
    pred_ids: Sequence[ArrayLike],
    offsets: Sequence[ArrayLike],
    spans: Sequence[Sequence[Mapping[str, Any]]],
) -> dict[str, tuple[int, int]]:
    """Per-type ``(recovered, total)`` PII span counts summed over documents.

    Same inputs and criterion as :func:`pii_recovery_per_doc`.
    """
    per_doc = pii_recovery_per_doc(true_ids, pred_ids, offsets, spans)
    return {kind: (int(r.sum()), int(t.sum())) for kind, (r, t) in per_doc.items()}


# --------------------------------------------------------------------------
# baselines
# --------------------------------------------------------------------------


def uniform_baseline(vocab_size: int, k: int = 1) -> float:
    """Accuracy@k of guessing ``k`` distinct tokens uniformly: ``min(k, |V|) / |V|``."""
    k = _check_k(k)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 1:
        raise ValueError(f"vocab_size must be an integer >= 1, got {vocab_size!r}")
    return min(k, int(vocab_size)) / int(vocab_size)


def _flatten(ids: Sequence[ArrayLike] | ArrayLike, what: str) -> np.ndarray:
    """All token ids of ``ids`` (one flat array, or one array per document) as 1-D int64."""
    if isinstance(ids, np.ndarray) or not isinstance(ids, Sequence):
        return _ids(np.asarray(ids).reshape(-1), what)
    if len(ids) == 0:
        return np.zeros(0, dtype=np.int64)
    if np.ndim(ids[0]) == 0:  # a flat list of ids
        return _ids(np.asarray(ids), what)
    return np.concatenate([_ids(d, f"{what}[{i}]") for i, d in enumerate(ids)])


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
    k = _check_k(k)
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
        d = _ids(d, f"test_token_ids[{i}]")
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


# --------------------------------------------------------------------------
# confidence intervals
# --------------------------------------------------------------------------


def bootstrap_ci(
    per_doc_numerators: ArrayLike,
    per_doc_denominators: ArrayLike,
    n_boot: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
) -> tuple[float, float, float]:
    """Percentile bootstrap CI of ``sum(num) / sum(den)``, resampling documents.

    Each replicate draws ``n_docs`` documents with replacement and recomputes
    the ratio of sums; the interval is the (alpha/2, 1 - alpha/2) quantiles of
    the replicates.  Replicates whose resampled denominator is zero are
    dropped.  Deterministic for a given ``seed``.

    Use ``den = tokens per doc`` for token accuracy (micro average) and
    ``den = 1`` for per-document scores such as F1 (mean over documents).

    Returns:
        ``(value, ci_low, ci_high)`` as Python floats.
    """
    num = np.asarray(per_doc_numerators, dtype=np.float64).reshape(-1)
    den = np.asarray(per_doc_denominators, dtype=np.float64).reshape(-1)
    if len(num) == 0:
        raise ValueError("bootstrap_ci needs at least one document, got none")
    if len(num) != len(den):
        raise ValueError(f"{len(num)} numerators but {len(den)} denominators; pass one of each per document")
    if not (np.isfinite(num).all() and np.isfinite(den).all()):
        raise ValueError("bootstrap_ci inputs must be finite numbers")
    if (den < 0).any():
        raise ValueError("bootstrap_ci denominators must be >= 0")
    if den.sum() == 0:
        raise ValueError("bootstrap_ci: the denominators sum to zero (no tokens / spans to score)")
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 1:
        raise ValueError(f"n_boot must be an integer >= 1, got {n_boot!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    value = float(num.sum() / den.sum())
    n = len(num)
    rng = np.random.default_rng(seed)
    stats = np.empty(int(n_boot), dtype=np.float64)  # (n_boot,)
    chunk = max(1, min(int(n_boot), _MAX_BOOT_DRAWS // n))
    for start in range(0, int(n_boot), chunk):
        m = min(chunk, int(n_boot) - start)
        idx = rng.integers(0, n, size=(m, n))  # (m, n) resampled documents
        num_s, den_s = num[idx].sum(axis=1), den[idx].sum(axis=1)  # (m,), (m,)
        with np.errstate(divide="ignore", invalid="ignore"):
            stats[start : start + m] = np.where(den_s > 0, num_s / den_s, np.nan)
    if np.isnan(stats).all():
        return value, value, value
    low, high = np.nanquantile(stats, [alpha / 2.0, 1.0 - alpha / 2.0])
    return value, float(low), float(high)


# --------------------------------------------------------------------------
# summary
# --------------------------------------------------------------------------


def _entry(
    num: ArrayLike, den: ArrayLike, *, n: int, kind: str, n_boot: int, seed: int, alpha: float
) -> dict[str, Any]:
    value, low, high = bootstrap_ci(num, den, n_boot=n_boot, seed=seed, alpha=alpha)
    return {
        "value": value,
        "ci_low": low,
        "ci_high": high,
        "n": int(n),
        "higher_is_better": True,
        "kind": kind,
    }


def summarize(
    true_ids: Sequence[ArrayLike],
    topk_ids: Sequence[ArrayLike],
    *,
    ks: Sequence[int] = (1, 5),
    offsets: Sequence[ArrayLike] | None = None,
    spans: Sequence[Sequence[Mapping[str, Any]]] | None = None,
    vocab_size: int | None = None,
    train_token_ids: Sequence[ArrayLike] | ArrayLike | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
) -> dict[str, dict[str, Any]]:
    """Every attack metric for a set of test documents, with bootstrap CIs.

    Args:
        true_ids: one 1-D array of true token ids per document.
        topk_ids: one ``(T, K)`` array of ranked guesses per document; column
            0 is the top-1 prediction used for F1, exact match and PII.
        ks: the k of each ``token_acc_top{k}``; a k larger than the number of
            guesses supplied is skipped with a warning.
        offsets, spans: per-document offset mappings and PII spans (both or
            neither); give ``pii_recovery_<type>`` for each type with a
            scorable span.
        vocab_size: adds ``baseline_uniform_top{k}`` (no CI, kind "info").
        train_token_ids: adds ``baseline_unigram_top{k}`` on the test docs
            (with CI, kind "info").
        n_boot, seed, alpha: bootstrap settings (same seed for every metric,
            so all metrics use the same resampled document sets).

    Returns:
        ``{metric: {value, ci_low, ci_high, n, higher_is_better, kind}}``
        where ``n`` counts the units averaged over (tokens for accuracies and
        the unigram baseline, documents for F1 and exact match, spans for PII)
        and ``kind`` is "accuracy" for attack metrics and "info" for baselines
        (see ``benchmarks.schema``).
    """
    n_docs = _check_docs(true_ids, topk_ids, "true_ids", "topk_ids")
    boot = {"n_boot": n_boot, "seed": seed, "alpha": alpha}
    trues = [_ids(t, f"true_ids[{i}]") for i, t in enumerate(true_ids)]
    guesses = [_topk(g, len(t), f"topk_ids[{i}]") for i, (t, g) in enumerate(zip(trues, topk_ids))]
    n_guess = min((g.shape[1] for g in guesses if len(g)), default=0)  # empty docs don't count
    top1 = [g[:, 0] for g in guesses]
    n_tokens = int(sum(len(t) for t in trues))
    if n_tokens == 0:
        raise ValueError("true_ids holds no tokens: nothing to score")
    ks = [_check_k(k) for k in ks]
    out: dict[str, dict[str, Any]] = {}
    for k in ks:
        if k > n_guess:
            logger.warning("token_acc_top%d skipped: only %d guess(es) per position supplied", k, n_guess)
            continue
        correct, total = token_accuracy_topk(trues, guesses, k)
        out[f"token_acc_top{k}"] = _entry(correct, total, n=n_tokens, kind="accuracy", **boot)
    ones = np.ones(n_docs)
    out["token_f1"] = _entry(token_f1(trues, top1), ones, n=n_docs, kind="accuracy", **boot)
    out["exact_match"] = _entry(exact_match(trues, top1), ones, n=n_docs, kind="accuracy", **boot)
    if (offsets is None) != (spans is None):
        raise ValueError("pass both offsets and spans for PII recovery, or neither")
    if offsets is not None and spans is not None:
        for kind, (rec, tot) in sorted(pii_recovery_per_doc(trues, top1, offsets, spans).items()):
            if tot.sum() == 0:
                logger.warning("pii_recovery_%s skipped: no scorable span of that type", kind)
                continue
            out[f"pii_recovery_{kind}"] = _entry(rec, tot, n=int(tot.sum()), kind="accuracy", **boot)
    if vocab_size is not None:
        for k in ks:
            out[f"baseline_uniform_top{k}"] = {
                "value": uniform_baseline(vocab_size, k),
                "ci_low": None,
                "ci_high": None,
                "n": n_tokens,
                "higher_is_better": True,
                "kind": "info",
            }
    if train_token_ids is not None:
        for k in ks:
            hits, total = unigram_prior_hits(train_token_ids, trues, k)
            out[f"baseline_unigram_top{k}"] = _entry(hits, total, n=n_tokens, kind="info", **boot)
    return out
