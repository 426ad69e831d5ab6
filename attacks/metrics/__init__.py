"""Metrics for inversion attacks (DESIGN.md §5): pure functions on token ids, one entry per document.

:mod:`~attacks.metrics.core` (token accuracy, F1, exact match, PII recovery),
:mod:`~attacks.metrics.baselines` (uniform, unigram and position priors,
coverage), :mod:`~attacks.metrics.intervals` (bootstrap, Clopper-Pearson,
paired bootstrap of a difference) and :mod:`~attacks.metrics.summary`
(:func:`summarize`, every metric with its interval, baselines and lift).
"""

from attacks.metrics.baselines import (TokenPrior, coverage, uniform_baseline, unigram_prior_baseline,
                                       unigram_prior_hits)
from attacks.metrics.core import (exact_match, pii_recovery_per_doc, pii_spans_recovered,
                                  token_accuracy_topk, token_f1)
from attacks.metrics.intervals import (bootstrap_ci, clopper_pearson, document_extremes, interval,
                                      paired_bootstrap_diff, paired_token_diff)
from attacks.metrics.summary import scoped_counts, summarize

__all__ = ["TokenPrior", "bootstrap_ci", "clopper_pearson", "coverage", "document_extremes", "exact_match",
           "interval", "paired_bootstrap_diff", "paired_token_diff", "pii_recovery_per_doc", "pii_spans_recovered", "scoped_counts",
           "summarize", "token_accuracy_topk", "token_f1", "uniform_baseline", "unigram_prior_baseline",
           "unigram_prior_hits"]
