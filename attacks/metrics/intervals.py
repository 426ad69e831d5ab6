"""Intervals over documents (issue 14 item 6; issue 28 finding 2).

Documents are the unit everywhere (DESIGN.md section 5):

* :func:`bootstrap_ci` -- percentile bootstrap CI of a ratio of sums,
  resampling documents with replacement.
* :func:`clopper_pearson` -- exact binomial bounds (Clopper and Pearson 1934).
* :func:`document_extremes` -- the exact bounds when every *document* succeeds
  or fails: Clopper-Pearson with the documents as the trials.
* :func:`interval` -- the rule every reported metric follows: no interval
  (n/a) with fewer than 2 documents; when every case succeeds or fails, the
  exact bounds over documents; otherwise the bootstrap over documents, widened
  so that it is never narrower than is possible (:func:`interval` says how).
* :func:`paired_bootstrap_diff` -- CI of the difference of two ratios on the
  same documents (attacker vs attacker, defended vs undefended, attacker vs
  baseline), resampling documents jointly, instead of checking whether two
  intervals are disjoint; :func:`paired_token_diff` is the same from per-token
  correctness on one common scored set.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

# Upper bound on resampled indices held in memory at once by the bootstraps.
_MAX_BOOT_DRAWS = 4_000_000

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


def clopper_pearson(successes: int, trials: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact two-sided binomial interval (Clopper and Pearson 1934) for ``successes`` of ``trials``.

    Closed form at the ends: all successes give ``[(alpha/2)^(1/n), 1]``
    (332 of 332 -> lower bound 98.9%), none ``[0, 1 - (alpha/2)^(1/n)]``;
    otherwise the beta quantiles.
    """
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"clopper_pearson needs 0 <= successes <= trials and trials >= 1, got {successes}/{trials}")
    if successes == trials:
        return float((alpha / 2) ** (1.0 / trials)), 1.0
    if successes == 0:
        return 0.0, float(1.0 - (alpha / 2) ** (1.0 / trials))
    from scipy.stats import beta

    return (float(beta.ppf(alpha / 2, successes, trials - successes + 1)),
            float(beta.ppf(1 - alpha / 2, successes + 1, trials - successes)))


def document_extremes(n_docs: int, alpha: float = 0.05) -> tuple[float, float]:
    """``(L, U)``: the exact lower bound when all ``n_docs`` documents succeed and the exact upper bound when all fail.

    Clopper-Pearson with the documents as the trials: ``L = (alpha/2)^(1/D)``,
    ``U = 1 - L`` (4 documents: 39.8% and 60.2%; 20: 83.2% and 16.8%; 60:
    94.0% and 6.0%). Tokens of one document are not independent, so a score
    of 100% on 64 tokens of 4 documents supports no more than 100% of 4
    documents does.
    """
    if n_docs < 1:
        raise ValueError(f"document_extremes needs at least 1 document, got {n_docs}")
    low = float((alpha / 2) ** (1.0 / n_docs))
    return low, 1.0 - low


def interval(num: ArrayLike, den: ArrayLike, *, binary: bool, n_boot: int = 1000, seed: int = 0,
             alpha: float = 0.05) -> tuple[float, float | None, float | None]:
    """``(value, low, high)`` of ``sum(num) / sum(den)`` by the reporting rule of this module.

    Documents with ``den == 0`` do not count; ``D`` is the number that do.

    * ``D < 2``: no interval (``None`` bounds, printed n/a).
    * A share (``0 <= num <= den`` per document) where every document scores 1
      or every one scores 0 (every token right or every token wrong):
      :func:`document_extremes`, ``[L, 1]`` or ``[0, U]``, never the
      Clopper-Pearson bound over tokens as if they were independent.
    * Otherwise the percentile :func:`bootstrap_ci` over documents, widened so
      that it is never narrower than is possible:

      - ``binary`` (each unit a success or a failure, e.g. tokens right /
        wrong): to at least the Clopper-Pearson interval of the pooled counts
        (tokens of a document are positively correlated, if at all, so they
        carry no more information than as many independent tokens). 2 of 16
        tokens over 4 documents: the bootstrap's [0.0, 25.0] becomes at least
        the exact [1.6, 38.3], so [0.0, 38.3], then [0.0, 60.2] by the next rule;
      - a share: the lower bound at most ``L`` and the upper at least ``U``
        (no outcome is more certain than the most extreme one: 63 of 64 tokens
        over 4 documents cannot have a lower bound above the 39.8% that 64 of
        64 gets).

    Deviation from a plain bootstrap: with few documents these floors, not the
    bootstrap, set the width; that is intended (issue 28, finding 2).
    """
    num = np.asarray(num, dtype=np.float64).reshape(-1)
    den = np.asarray(den, dtype=np.float64).reshape(-1)
    if len(num) != len(den):
        raise ValueError(f"{len(num)} numerators but {len(den)} denominators; pass one of each per document")
    used = den > 0
    if not used.any():
        raise ValueError("interval: the denominators sum to zero (no tokens / spans to score)")
    value = float(num.sum() / den.sum())
    n_docs = int(used.sum())
    if n_docs < 2:
        return value, None, None
    num, den = num[used], den[used]
    share = bool(((num >= 0) & (num <= den)).all())
    if share:
        ext_low, ext_high = document_extremes(n_docs, alpha)
        if (num == den).all():
            return value, ext_low, 1.0
        if (num == 0).all():
            return value, 0.0, ext_high
    _, low, high = bootstrap_ci(num, den, n_boot=n_boot, seed=seed, alpha=alpha)
    if binary:
        cp_low, cp_high = clopper_pearson(int(round(num.sum())), int(round(den.sum())), alpha)
        low, high = min(low, cp_low), max(high, cp_high)
    if share:
        low, high = min(low, ext_low), max(high, ext_high)
    return value, float(low), float(high)


def paired_bootstrap_diff(num_a: ArrayLike, den_a: ArrayLike, num_b: ArrayLike, den_b: ArrayLike, *,
                          n_boot: int = 1000, seed: int = 0, alpha: float = 0.05
                          ) -> tuple[float, float | None, float | None]:
    """``(diff, low, high)`` for ``sum(num_a)/sum(den_a) - sum(num_b)/sum(den_b)`` on the same documents.

    Each replicate draws one set of documents (with replacement) and
    recomputes both ratios on it, so the comparison keeps the pairing: a
    difference is significant at level ``alpha`` when the interval excludes 0.
    Fewer than 2 documents: ``None`` bounds.
    """
    arrs = [np.asarray(x, dtype=np.float64).reshape(-1) for x in (num_a, den_a, num_b, den_b)]
    if len({len(a) for a in arrs}) != 1:
        raise ValueError(f"paired_bootstrap_diff needs one entry per document in all four arrays, got lengths "
                         f"{[len(a) for a in arrs]}; score both attackers on the same documents")
    na, da, nb, db = arrs
    if da.sum() == 0 or db.sum() == 0:
        raise ValueError("paired_bootstrap_diff: a denominator sums to zero (nothing scored)")
    diff = float(na.sum() / da.sum() - nb.sum() / db.sum())
    n = len(na)
    if n < 2:
        return diff, None, None
    rng = np.random.default_rng(seed)
    stats = np.empty(int(n_boot), dtype=np.float64)  # (n_boot,)
    chunk = max(1, min(int(n_boot), _MAX_BOOT_DRAWS // n))
    for start in range(0, int(n_boot), chunk):
        m = min(chunk, int(n_boot) - start)
        idx = rng.integers(0, n, size=(m, n))  # (m, n) resampled documents, shared by a and b
        sa, sb = da[idx].sum(axis=1), db[idx].sum(axis=1)  # (m,), (m,)
        with np.errstate(divide="ignore", invalid="ignore"):
            stats[start: start + m] = np.where((sa > 0) & (sb > 0),
                                               na[idx].sum(axis=1) / sa - nb[idx].sum(axis=1) / sb, np.nan)
    if np.isnan(stats).all():
        return diff, None, None
    low, high = np.nanquantile(stats, [alpha / 2.0, 1.0 - alpha / 2.0])
    return diff, float(low), float(high)


def paired_token_diff(doc_ids: ArrayLike, correct_a: ArrayLike, correct_b: ArrayLike, *, n_boot: int = 1000,
                      seed: int = 0, alpha: float = 0.05) -> tuple[float, float | None, float | None]:
    """``(diff, low, high)`` of accuracy A minus accuracy B scored on the *same tokens*, paired over documents.

    ``doc_ids`` names each token's document, ``correct_a`` / ``correct_b`` say
    whether A / B got that token right (one entry per token of the common
    scored set, in the same order for both). Counts are summed per document
    and passed to :func:`paired_bootstrap_diff`. Use it for defended vs
    undefended recovery on one scored set, and for attacker vs attacker.

    The interval is widened to at least the exact conditional interval of the
    discordant tokens (as McNemar's exact test: of the ``m`` tokens exactly
    one side gets right, ``b`` are A's; Clopper-Pearson on ``b`` of ``m``
    mapped to ``m / N * (2 p - 1)``), so that a few documents with equal
    per-document differences cannot give a zero-width interval: 4 documents in
    which A wins one token of 4 each print +25.0 [-5.1, +25.0], not
    [+25.0, +25.0] (4 discordant tokens are not significant, as the sign test says).
    """
    doc = np.asarray(doc_ids).reshape(-1)
    a = np.asarray(correct_a, dtype=np.float64).reshape(-1)
    b = np.asarray(correct_b, dtype=np.float64).reshape(-1)
    if not len(doc) == len(a) == len(b):
        raise ValueError(f"paired_token_diff needs one doc id and one result of each side per token, got "
                         f"{len(doc)}, {len(a)}, {len(b)}; score both sides on the same tokens")
    if len(doc) == 0:
        raise ValueError("paired_token_diff: no tokens to compare")
    _, unit = np.unique(doc, return_inverse=True)  # (N,) document index of each token
    tot = np.bincount(unit).astype(np.float64)  # (D,)
    diff, low, high = paired_bootstrap_diff(np.bincount(unit, weights=a), tot, np.bincount(unit, weights=b), tot,
                                            n_boot=n_boot, seed=seed, alpha=alpha)
    wins, losses = int(((a > 0) & (b <= 0)).sum()), int(((a <= 0) & (b > 0)).sum())
    if low is None or wins + losses == 0:
        return diff, low, high
    m, n = wins + losses, len(doc)
    p_low, p_high = clopper_pearson(wins, m, alpha)
    return diff, min(low, m / n * (2 * p_low - 1)), max(high, m / n * (2 * p_high - 1))
