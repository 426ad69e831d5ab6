"""Paired comparison of two scored runs on one scored set, from their per-token predictions files.

``splitinfer attack compare A B`` answers "does A recover more than B?" for two
runs scored on exactly the same tokens: two attackers of one defense cell, two
defenses of one grid at one head depth (their cells share the scored set), a
defended run and the undefended one. Each side's top-1 recovery is its
``token_acc_top1`` (user text; template and special positions are public and
left out, as every table does), and the difference comes with the paired
bootstrap over documents of :func:`attacks.evaluate.paired_gap`, seeded from
the files' settings: the function behind the grid's own "vs undefended" and
"strongest leads by" columns, so a pair the report shows prints the same
interval here (DESIGN.md section 5). Reading two unpaired
intervals for overlap instead is both weaker and, with correlated documents,
misleading.

Two files whose scored tokens differ (documents, their order, true tokens or
template marks) are refused: their difference would mix a change of attacker
or defense with a change of text.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from attacks.errors import AttackError
from attacks.evaluate import doc_top1_counts, paired_gap
from attacks.predictions import Predictions, read_predictions

__all__ = ["compare"]


def _first_difference(a: Predictions, b: Predictions) -> str | None:
    if a.doc_ids != b.doc_ids:
        only = sorted(set(a.doc_ids) ^ set(b.doc_ids), key=str)
        return (f"document {only[0]!r} is in one file only" if only else "the documents come in another order")
    for doc, ta, tb, ma, mb in zip(a.doc_ids, a.true, b.true, a.template, b.template):
        if not (np.array_equal(ta, tb) and np.array_equal(np.asarray(ma, bool), np.asarray(mb, bool))):
            return f"document {doc!r} holds other tokens"
    return None


def compare(path_a: str | os.PathLike[str], path_b: str | os.PathLike[str]) -> dict[str, Any]:
    """Top-1 recovery of A and of B on their common scored set and A minus B with its paired 95% interval.

    Returns ``a`` / ``b`` (the runs' names and values), ``diff`` / ``ci_low`` / ``ci_high`` (fractions),
    ``significant`` (the interval excludes 0), ``n_tokens``, ``n_documents``, and ``complete`` (false when a
    size cap left documents out of the files: the comparison then covers the documents kept).
    """
    a, b = read_predictions(path_a), read_predictions(path_b)
    why = _first_difference(a, b)
    if why:
        raise AttackError(f"{os.fspath(path_a)!r} and {os.fspath(path_b)!r} were scored on different tokens ({why}); "
                          "compare runs of one scored set: attackers of one defense cell, or defenses of one grid "
                          "at one head depth")
    ca, cb = doc_top1_counts(a), doc_top1_counts(b)  # per document: user-text top-1 (correct, total)
    total = np.asarray(ca["total"], dtype=np.float64)  # (D,) the same for both: the same tokens
    if total.sum() == 0:
        raise AttackError(f"{os.fspath(path_a)!r}: no user-text tokens to compare (every position is template)")
    gap = paired_gap({"doc_top1": ca}, {"doc_top1": cb}, n_boot=int(a.settings.get("n_boot", 1000)),
                     seed=int(a.settings.get("seed", 0)))
    low, high = gap["ci_low"], gap["ci_high"]
    acc = {side: float(np.sum(c["correct"]) / total.sum()) for side, c in (("a", ca), ("b", cb))}
    return {"a": {"run": a.meta.get("run", os.fspath(path_a)), "token_acc_top1": acc["a"]},
            "b": {"run": b.meta.get("run", os.fspath(path_b)), "token_acc_top1": acc["b"]},
            "diff": gap["value"], "ci_low": low, "ci_high": high,
            "significant": low is not None and (low > 0 or high < 0),
            "n_tokens": int(total.sum()), "n_documents": int((total > 0).sum()), "complete": a.complete and b.complete}
