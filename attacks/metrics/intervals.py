"""Intervals over documents (issue 14 item 6).

* :func:`bootstrap_ci` -- percentile bootstrap CI of a ratio of sums,
  resampling documents with replacement.
* :func:`clopper_pearson` -- exact binomial bounds, used when every case
  succeeds or every case fails (a bootstrap then gives a zero-width interval).
* :func:`interval` -- the rule every reported metric follows: no interval
  (n/a) with fewer than 2 documents, exact bounds at 0% or 100%, else the
  bootstrap.
* :func:`paired_bootstrap_diff` -- CI of the difference of two ratios on the
  same documents (attacker vs attacker, attacker vs baseline), resampling
  documents jointly, instead of checking whether two intervals are disjoint.
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


def interval(num: ArrayLike, den: ArrayLike, *, binary: bool, n_boot: int = 1000, seed: int = 0,
             alpha: float = 0.05) -> tuple[float, float | None, float | None]:
    """``(value, low, high)`` of ``sum(num) / sum(den)`` by the reporting rule of this module.

    Documents with ``den == 0`` do not count. Fewer than 2 documents: no
    interval (``None`` bounds, printed n/a). ``binary`` (each unit a success
    or a failure, e.g. tokens right / wrong) and every unit succeeded or
    failed: :func:`clopper_pearson` on the pooled counts. Otherwise
    :func:`bootstrap_ci` over documents.
    """
    num = np.asarray(num, dtype=np.float64).reshape(-1)
    den = np.asarray(den, dtype=np.float64).reshape(-1)
    if len(num) != len(den):
        raise ValueError(f"{len(num)} numerators but {len(den)} denominators; pass one of each per document")
    used = den > 0
    if not used.any():
        raise ValueError("interval: the denominators sum to zero (no tokens / spans to score)")
    value = float(num.sum() / den.sum())
    if used.sum() < 2:
        return value, None, None
    k, n = float(num.sum()), float(den.sum())
    if binary and (k == 0 or k == n):
        low, high = clopper_pearson(int(k), int(n), alpha)
        return value, low, high
    return bootstrap_ci(num[used], den[used], n_boot=n_boot, seed=seed, alpha=alpha)


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
