"""Every attack metric of a set of test documents, with baselines, lift, coverage and intervals.

:func:`summarize` returns ``{metric: {value, ci_low, ci_high, n,
higher_is_better, kind}}`` (the shape of DESIGN.md §7). Scopes (issue 14
item 2): token metrics are computed on *user text* (tokens holding turn
content; every token of a corpus without a chat template) and, apart, on
*template* tokens (system prompt, role markers); the un-prefixed keys are user
text, the headline. Keys:

* ``token_acc_top{k}``, ``token_f1``, ``exact_match`` (user text);
  ``pii_recovery_<type>`` (spans, which lie in user text);
* ``template_token_acc_top{k}`` and ``template_baseline_position_top{k}``
  when template tokens exist;
* ``baseline_uniform_top{k}``; ``baseline_unigram_top{k}``,
  ``baseline_unigram_exact_match``, ``baseline_unigram_pii_recovery_<type>``;
  the position prior ``baseline_position_...`` likewise (when training
  positions are known);
* ``lift_<metric>``: the metric minus its strongest baseline, with a paired
  bootstrap CI of the difference over documents;
* ``coverage``: share of user-text test tokens seen in training.

Intervals follow :func:`attacks.metrics.intervals.interval` (n/a below 2
documents, Clopper-Pearson over documents at 0% / 100%, else a bootstrap over
documents never narrower than the pooled exact interval);
every metric uses the same bootstrap seed, so the same resampled documents.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from attacks.metrics.baselines import TokenPrior, coverage, uniform_baseline
from attacks.metrics.core import (as_ids, as_topk, check_docs, check_k, exact_match, pii_recovery_per_doc,
                                  token_accuracy_topk, token_f1)
from attacks.metrics.intervals import interval, paired_bootstrap_diff

logger = logging.getLogger(__name__)

__all__ = ["summarize", "scoped_counts"]


def _entry(num: ArrayLike, den: ArrayLike, *, n: int, kind: str, binary: bool, boot: dict) -> dict[str, Any]:
    value, low, high = interval(num, den, binary=binary, **boot)
    return {"value": value, "ci_low": low, "ci_high": high, "n": int(n), "higher_is_better": True, "kind": kind}


def scoped_counts(trues: Sequence[np.ndarray], guesses: Sequence[np.ndarray], masks: Sequence[np.ndarray],
                  k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-document (correct, total) at ``k`` over the tokens selected by ``masks`` (one bool (T,) per document)."""
    return token_accuracy_topk([t[m] for t, m in zip(trues, masks)], [g[m] for g, m in zip(guesses, masks)], k)


class _Scorer:
    """Scores one set of per-token guesses (an attack's or a baseline's) on the user-text tokens."""

    def __init__(self, trues, user, offsets, spans, boot):
        self.trues, self.user, self.offsets, self.spans, self.boot = trues, user, offsets, spans, boot
        self.docs = [i for i, u in enumerate(user) if u.any()]  # documents with user text

    def tokens(self, guesses, k):
        return scoped_counts(self.trues, guesses, self.user, k)

    def exact(self, guesses):
        t = [self.trues[i][self.user[i]] for i in self.docs]
        return exact_match(t, [guesses[i][self.user[i], 0] for i in self.docs]).astype(np.int64), np.ones(len(t))

    def pii(self, guesses):
        if self.offsets is None:
            return {}
        per = pii_recovery_per_doc(self.trues, [g[:, 0] for g in guesses], self.offsets, self.spans)
        return {kind: rt for kind, rt in sorted(per.items()) if rt[1].sum() > 0}


def summarize(
    true_ids: Sequence[ArrayLike],
    topk_ids: Sequence[ArrayLike],
    *,
    ks: Sequence[int] = (1, 5),
    offsets: Sequence[ArrayLike] | None = None,
    spans: Sequence[Sequence[Mapping[str, Any]]] | None = None,
    vocab_size: int | None = None,
    train_token_ids: Sequence[ArrayLike] | ArrayLike | None = None,
    prior: TokenPrior | None = None,
    positions: Sequence[ArrayLike] | None = None,
    template_mask: Sequence[ArrayLike] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
) -> dict[str, dict[str, Any]]:
    """Every attack metric for a set of test documents (module docstring for the keys).

    Args:
        true_ids: one 1-D array of true token ids per document.
        topk_ids: one ``(T, K)`` array of ranked guesses per document; column
            0 is the top-1 prediction used for F1, exact match and PII.
        ks: the k of each ``token_acc_top{k}``; a k larger than the number of
            guesses supplied is skipped with a warning.
        offsets, spans: per-document offset mappings and PII spans (both or neither).
        vocab_size: adds ``baseline_uniform_top{k}`` (no CI).
        train_token_ids: the training tokens, for the unigram prior when no
            ``prior`` is given.
        prior: a :class:`TokenPrior` of the training tokens: unigram and (if it
            has positions and ``positions`` are given) position-prior
            baselines, ``coverage`` and ``lift_*``.
        positions: per document, each token's position in its sequence (T,).
        template_mask: per document, True for template tokens (T,); default none.
        n_boot, seed, alpha: interval settings.
    """
    n_docs = check_docs(true_ids, topk_ids, "true_ids", "topk_ids")
    boot = {"n_boot": n_boot, "seed": seed, "alpha": alpha}
    trues = [as_ids(t, f"true_ids[{i}]") for i, t in enumerate(true_ids)]
    guesses = [as_topk(g, len(t), f"topk_ids[{i}]") for i, (t, g) in enumerate(zip(trues, topk_ids))]
    if sum(len(t) for t in trues) == 0:
        raise ValueError("true_ids holds no tokens: nothing to score")
    tmpl = [np.zeros(len(t), bool) for t in trues] if template_mask is None else \
        [np.asarray(m, dtype=bool).reshape(-1) for m in template_mask]
    check_docs(trues, tmpl, "true_ids", "template_mask")
    if any(len(m) != len(t) for m, t in zip(tmpl, trues)):
        raise ValueError("template_mask must hold one flag per token of each document")
    user = [~m for m in tmpl]
    n_user = int(sum(u.sum() for u in user))
    if n_user == 0:
        raise ValueError("every token is a template token: no user text to score")
    if (offsets is None) != (spans is None):
        raise ValueError("pass both offsets and spans for PII recovery, or neither")
    n_guess = min((g.shape[1] for g in guesses if len(g)), default=0)
    ks = [check_k(k) for k in ks]
    for k in [k for k in ks if k > n_guess]:
        logger.warning("token_acc_top%d skipped: only %d guess(es) per position supplied", k, n_guess)
    ks = [k for k in ks if k <= n_guess]
    sc = _Scorer(trues, user, offsets, spans, boot)
    out: dict[str, dict[str, Any]] = {}
    per_doc: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # metric -> the attack's per-doc counts, for lift
    for k in ks:
        per_doc[f"token_acc_top{k}"] = sc.tokens(guesses, k)
        out[f"token_acc_top{k}"] = _entry(*per_doc[f"token_acc_top{k}"], n=n_user, kind="accuracy", binary=True,
                                          boot=boot)
    docs = sc.docs
    f1 = token_f1([trues[i][user[i]] for i in docs], [guesses[i][user[i], 0] for i in docs])
    out["token_f1"] = _entry(f1, np.ones(len(docs)), n=len(docs), kind="accuracy", binary=False, boot=boot)
    per_doc["exact_match"] = sc.exact(guesses)
    out["exact_match"] = _entry(*per_doc["exact_match"], n=len(docs), kind="accuracy", binary=True, boot=boot)
    for kind, rt in sc.pii(guesses).items():
        per_doc[f"pii_recovery_{kind}"] = rt
        out[f"pii_recovery_{kind}"] = _entry(*rt, n=int(rt[1].sum()), kind="accuracy", binary=True, boot=boot)
    n_tmpl = int(sum(m.sum() for m in tmpl))
    for k in ks if n_tmpl else []:
        out[f"template_token_acc_top{k}"] = _entry(*scoped_counts(trues, guesses, tmpl, k), n=n_tmpl, kind="info",
                                                   binary=True, boot=boot)
    if prior is None and train_token_ids is not None:
        prior = TokenPrior.fit(train_token_ids, None, k=max(ks, default=1))
    baselines: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}  # metric -> {baseline: per-doc counts}
    if vocab_size is not None:
        for k in ks:
            p = uniform_baseline(vocab_size, k)
            out[f"baseline_uniform_top{k}"] = {"value": p, "ci_low": None, "ci_high": None, "n": n_user,
                                               "higher_is_better": True, "kind": "info"}
            tot = per_doc[f"token_acc_top{k}"][1]
            baselines.setdefault(f"token_acc_top{k}", {})["uniform"] = (tot * p, tot)
    if prior is not None:
        priors = {"unigram": [prior.unigram_guesses(len(t)) for t in trues]}
        if prior.has_positions and positions is not None:
            check_docs(trues, positions, "true_ids", "positions")
            priors["position"] = [prior.position_guesses(p) for p in positions]
        for name, g in priors.items():
            counts = {f"token_acc_top{k}": sc.tokens(g, k) for k in ks if k <= g[0].shape[1]}
            counts["exact_match"] = sc.exact(g)
            counts.update({f"pii_recovery_{kind}": rt for kind, rt in sc.pii(g).items()})
            for metric, rt in counts.items():
                key = f"baseline_{name}_top{metric[len('token_acc_top'):]}" if metric.startswith("token_acc") \
                    else f"baseline_{name}_{metric}"
                n = out[metric]["n"] if metric in out else int(rt[1].sum())
                out[key] = _entry(*rt, n=n, kind="info", binary=True, boot=boot)
                baselines.setdefault(metric, {})[name] = rt
            for k in ks if (n_tmpl and name == "position") else []:
                out[f"template_baseline_position_top{k}"] = _entry(*scoped_counts(trues, g, tmpl, k), n=n_tmpl,
                                                                   kind="info", binary=True, boot=boot)
        seen, total = coverage(prior, [t[u] for t, u in zip(trues, user)])
        out["coverage"] = _entry(seen, total, n=n_user, kind="info", binary=True, boot=boot)
    for metric, options in baselines.items():
        if metric not in per_doc:
            continue
        best = max(options, key=lambda b: options[b][0].sum() / max(options[b][1].sum(), 1e-12))
        diff, low, high = paired_bootstrap_diff(*per_doc[metric], *options[best], **boot)
        out[f"lift_{metric}"] = {"value": diff, "ci_low": low, "ci_high": high, "n": out[metric]["n"],
                                 "higher_is_better": True, "kind": "info"}
    return out
