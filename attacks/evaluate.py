"""Score an :class:`~attacks.base.Inversion` against its taps with :mod:`attacks.metrics` (DESIGN.md §5).

:func:`collect` groups the scored token positions by document (a document's
sequences in order) into a :class:`~attacks.predictions.Predictions` record:
per token the true id, the attacker's ranked guesses, the position in its
sequence and whether it is a chat-template token (from the document's
``template_spans`` and the token's character offsets), plus character offsets
and PII spans where the taps carry them, and the training prior. Its
:meth:`~attacks.predictions.Predictions.summarize` gives every metric (user
text as the headline, template tokens apart, baselines, lift, coverage,
intervals); the record is what ``splitinfer attack rescore`` reads back.
:func:`score` does both; :func:`flat_report` turns a summary into the
one-line JSON of ``splitinfer attack eval --json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from attacks.base import Inversion
from attacks.errors import AttackError
from attacks.metrics.baselines import TokenPrior
from attacks.predictions import Predictions
from attacks.tapdata import Taps
from splitinfer.corpora import template_token_mask

__all__ = ["collect", "score", "flat_report", "prior_from_taps", "prior_tokens", "doc_top1_counts", "paired_gap"]


def prior_tokens(unigram_top: Sequence[int]) -> np.ndarray:
    """A token array whose frequency order is ``unigram_top`` (a unigram prior from a checkpoint's ``unigram_top``)."""
    top = np.asarray(unigram_top, dtype=np.int64)
    return np.repeat(top, np.arange(len(top), 0, -1))


def prior_from_taps(train: Taps, k: int = 5) -> TokenPrior:
    """The unigram and position priors (and training vocabulary) of the training taps."""
    return TokenPrior.fit(train.token_ids, train.positions(), k=k)


def collect(inv: Inversion, taps: Taps, *, vocab_size: int | None = None, train_token_ids: Any = None,
            prior: TokenPrior | None = None, ks: Sequence[int] = (1, 5), rows: np.ndarray | None = None,
            n_boot: int = 1000, seed: int = 0, meta: dict | None = None) -> Predictions:
    """The per-token predictions of ``inv`` on ``taps``, grouped by document, with what scoring them needs.

    ``rows`` restricts scoring to a subset of token positions (e.g. the first
    tokens only, for an expensive attack); ``inv`` is then aligned with
    ``rows``. Documents are kept whole in the grouping; PII spans outside the
    scored tokens are not scored. ``prior`` (see :func:`prior_from_taps`)
    gives the unigram and position baselines and coverage; without it,
    ``train_token_ids`` gives the unigram baseline only.
    """
    rows = np.arange(taps.n_tokens) if rows is None else np.asarray(rows, dtype=np.int64)
    if len(inv.tokens) != len(rows):
        raise AttackError(f"the inversion has {len(inv.tokens)} positions but {len(rows)} are scored")
    if prior is None and train_token_ids is not None:
        prior = TokenPrior.fit(train_token_ids, None, k=max(ks))
    doc = taps.doc_index()[rows]
    order = np.argsort(doc, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(doc[order])) + 1)
    docs = [taps.documents[int(doc[g[0]])] for g in groups]
    positions = taps.positions()[rows]
    offsets = None if taps.offsets is None else [taps.offsets[rows[g]] for g in groups]
    template = [template_token_mask(offsets[i], d.get("template_spans") or []) if offsets is not None
                else np.zeros(len(g), dtype=bool) for i, (g, d) in enumerate(zip(groups, docs))]
    spans = [list(d.get("pii_spans") or []) for d in docs] if offsets is not None and any(
        d.get("pii_spans") for d in docs) else None
    k_max = inv.topk.shape[1]
    return Predictions(
        doc_ids=[str(d.get("doc_id")) for d in docs], genres=[str(d.get("genre") or "") for d in docs],
        true=[taps.token_ids[rows[g]] for g in groups], topk=[np.asarray(inv.topk[g]) for g in groups],
        positions=[positions[g] for g in groups], template=template,
        offsets=offsets if spans is not None else None, spans=spans, prior=prior,
        settings={"ks": [k for k in ks if k <= k_max], "vocab_size": vocab_size, "n_boot": n_boot, "seed": seed},
        meta=dict(meta or {}))


def score(inv: Inversion, taps: Taps, **kwargs: Any) -> dict[str, dict[str, Any]]:
    """``{metric: {value, ci_low, ci_high, n, higher_is_better, kind}}`` for ``inv`` on ``taps`` (:func:`collect`)."""
    return collect(inv, taps, **kwargs).summarize()


def doc_top1_counts(pred: Predictions) -> dict[str, list]:
    """Per document, user-text top-1 (correct, total): what a paired comparison of two attackers needs."""
    from attacks.metrics import scoped_counts

    correct, total = scoped_counts(pred.true, pred.topk, [~t for t in pred.template], 1)
    return {"doc_ids": list(pred.doc_ids), "correct": correct.tolist(), "total": total.tolist()}


def paired_gap(a: dict[str, Any], b: dict[str, Any], n_boot: int = 1000, seed: int = 0
               ) -> dict[str, Any] | None:
    """top-1 of ``a`` minus ``b`` with a paired bootstrap interval over their shared documents (None: none shared).

    ``a`` and ``b`` carry ``doc_top1`` (:func:`doc_top1_counts`). Every paired difference of the tables ("vs
    undefended", "strongest leads by", a resend row's gain) and ``splitinfer attack compare`` is this one."""
    from attacks.metrics import paired_bootstrap_diff

    da, db = a.get("doc_top1"), b.get("doc_top1")
    if not da or not db:
        return None
    index = {d: i for i, d in enumerate(db["doc_ids"])}
    pairs = [(i, index[d]) for i, d in enumerate(da["doc_ids"]) if d in index]
    if not pairs:
        return None
    ia, ib = (np.asarray(p, dtype=np.int64) for p in zip(*pairs))
    ca, ta = np.asarray(da["correct"])[ia], np.asarray(da["total"])[ia]
    cb, tb = np.asarray(db["correct"])[ib], np.asarray(db["total"])[ib]
    if ta.sum() == 0 or tb.sum() == 0:
        return None
    diff, lo, hi = paired_bootstrap_diff(ca, ta, cb, tb, n_boot=n_boot, seed=seed)
    return {"value": diff, "ci_low": lo, "ci_high": hi, "n": len(pairs)}


def flat_report(summary: dict[str, dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """The ``attack eval --json`` object: headline values (user text), ``ci95`` per metric, ``pii_recovery`` by type."""
    out: dict[str, Any] = {"scope": "user text (chat template tokens scored apart as template_*)"}
    for key in ("token_acc_top1", "token_acc_top5", "token_f1", "exact_match", "coverage", "lift_token_acc_top1"):
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
