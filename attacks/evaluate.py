"""Score an :class:`~attacks.base.Inversion` against its taps with :mod:`attacks.metrics` (DESIGN.md §5).

:func:`score` groups token positions by document (a document's sequences in
order), then calls :func:`attacks.metrics.summarize`: token accuracy @1/@5,
token F1, exact match, PII recovery per type (when the taps carry character
offsets and PII spans), the uniform baseline and the training unigram prior,
all with 95% bootstrap CIs over documents. :func:`flat_report` turns that into
the one-line JSON of ``splitinfer attack eval --json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from attacks.base import Inversion
from attacks.errors import AttackError
from attacks.tapdata import Taps

__all__ = ["score", "flat_report", "prior_tokens"]


def prior_tokens(unigram_top: Sequence[int]) -> np.ndarray:
    """A token array whose frequency order is ``unigram_top`` (what ``summarize`` needs for the unigram prior)."""
    top = np.asarray(unigram_top, dtype=np.int64)
    return np.repeat(top, np.arange(len(top), 0, -1))


def score(inv: Inversion, taps: Taps, *, vocab_size: int | None = None, train_token_ids: Any = None,
          ks: Sequence[int] = (1, 5), rows: np.ndarray | None = None, n_boot: int = 1000,
          seed: int = 0) -> dict[str, dict[str, Any]]:
    """``{metric: {value, ci_low, ci_high, n, higher_is_better, kind}}`` for ``inv`` on ``taps``.

    ``rows`` restricts scoring to a subset of token positions (e.g. the first
    tokens only, for an expensive attack); ``inv`` is then aligned with
    ``rows``. Documents are kept whole in the grouping; PII spans outside the
    scored tokens are not scored.
    """
    from attacks.metrics import summarize

    rows = np.arange(taps.n_tokens) if rows is None else np.asarray(rows, dtype=np.int64)
    if len(inv.tokens) != len(rows):
        raise AttackError(f"the inversion has {len(inv.tokens)} positions but {len(rows)} are scored")
    doc = taps.doc_index()[rows]
    order = np.argsort(doc, kind="stable")
    bounds = np.flatnonzero(np.diff(doc[order])) + 1
    groups = np.split(order, bounds)
    true_ids = [taps.token_ids[rows[g]] for g in groups]
    topk = [inv.topk[g] for g in groups]
    kwargs: dict[str, Any] = {}
    if taps.offsets is not None:
        docs = [taps.documents[int(doc[g[0]])] for g in groups]
        if any(d.get("pii_spans") for d in docs):
            kwargs["offsets"] = [taps.offsets[rows[g]] for g in groups]
            kwargs["spans"] = [list(d.get("pii_spans") or []) for d in docs]
    ks = [k for k in ks if k <= inv.topk.shape[1]]
    return summarize(true_ids, topk, ks=ks, vocab_size=vocab_size, train_token_ids=train_token_ids,
                     n_boot=n_boot, seed=seed, **kwargs)


def flat_report(summary: dict[str, dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """The ``attack eval --json`` object: headline values, ``ci95`` per metric, ``pii_recovery`` by type."""
    out: dict[str, Any] = {}
    for key in ("token_acc_top1", "token_acc_top5", "token_f1", "exact_match"):
        if key in summary:
            out[key] = summary[key]["value"]
    first = summary.get("token_acc_top1") or next(iter(summary.values()))
    out["n_tokens"] = int(first["n"])
    out["n_documents"] = int(summary["token_f1"]["n"]) if "token_f1" in summary else None
    out["ci95"] = {k: [v["ci_low"], v["ci_high"]] for k, v in summary.items() if v.get("ci_low") is not None}
    pii = {k[len("pii_recovery_"):]: {"value": v["value"], "n_spans": v["n"], "ci95": [v["ci_low"], v["ci_high"]]}
           for k, v in summary.items() if k.startswith("pii_recovery_")}
    if pii:
        out["pii_recovery"] = pii
    out["baselines"] = {k[len("baseline_"):]: v["value"] for k, v in summary.items() if k.startswith("baseline_")}
    out.update(extra)
    out["metrics"] = summary
    return out
