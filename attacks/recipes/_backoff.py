"""Open-vocabulary backoff for the softmax attackers: an <unk> class backed by the embedding space.

A softmax trained on (activation, token) pairs can only name tokens it saw;
on our held-out documents about a fifth of the tokens (names, numbers, rare
code identifiers) never occur in a small training set. With ``backoff``, the
classifier's vocabulary keeps the tokens seen at least ``min_count`` times;
rarer training tokens train an extra ``<unk>`` class, and at scoring time the
``<unk>`` probability is spread over every other token of the full vocabulary
by a ridge map into the input-embedding space (``linear-embed``, fitted on the
same pairs): ``p_cls'(v) = p(<unk>) * softmax_v(z(v) / tau)`` for unknown v,
where ``z`` is the row-standardised embedding similarity. A classifier rarely
puts its mass on <unk> for inputs unlike its training data, so the result is
mixed with the embedding route over the whole vocabulary:
``p = lam * p_cls' + (1 - lam) * softmax(z / tau)``; ``tau`` and ``lam`` are
chosen on validation data (``lam = 1`` without it). This is the classic
unknown-word backoff plus interpolation; it needs the public base model's
embedding matrix.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from attacks.errors import AttackError
from attacks.tapdata import Taps

log = logging.getLogger(__name__)

TAUS = (0.05, 0.1, 0.2)
LAMS = (1.0, 0.6)
_CHUNK = 512
_SHORT = 64  # shortlist of most similar tokens per position


_MEMO: dict[tuple, Any] = {}  # the last backoffs fitted, so attackers trained on the same taps share one


def _key(model: Any, train: Taps, val: Taps | None, seed: int) -> tuple:
    def fp(t: Taps | None) -> tuple:
        if t is None:
            return ()
        return (id(t), t.n_tokens, float(np.asarray(t.hidden[:4], dtype=np.float64).sum()), int(t.token_ids[:64].sum()))

    return (model.sha256, seed, fp(train), fp(val))


def fit_backoff(model: Any, train: Taps, val: Taps | None, seed: int) -> Any:
    """A fitted ``linear-embed`` attacker for the backoff (reused for the same model, taps and seed)."""
    from attacks.registry import make_attack

    key = _key(model, train, val, seed)
    if key not in _MEMO:
        while len(_MEMO) >= 2:
            _MEMO.pop(next(iter(_MEMO)))
        _MEMO[key] = make_attack("linear-embed", model=model, seed=seed).fit(train, val)
    return _MEMO[key]


def _shortlist(backoff: Any, y: torch.Tensor, known: torch.Tensor, m: int = _SHORT) -> tuple[torch.Tensor, ...]:
    """Row-standardised similarities of the known tokens (n, V_r) and of the m most similar tokens (n, m) + ids.

    Row mean and std come from a fixed sample of the vocabulary. The softmaxes below are taken over the
    shortlist and the known tokens only: with tau <= 0.2 on standardised scores the rest of the vocabulary
    carries a negligible share of the mass, and this avoids several passes over (n, V).
    """
    z = backoff.scores(y)  # (n, V): the one pass over the vocabulary
    sample = torch.arange(0, z.shape[1], max(1, z.shape[1] // 4096))
    zs = z[:, sample]
    mu, sd = zs.mean(1, keepdim=True), zs.std(1, keepdim=True) + 1e-6
    top_v, top_i = z.topk(min(m, z.shape[1]), dim=1)  # (n, m)
    return (z[:, known] - mu) / sd, (top_v - mu) / sd, top_i


def _mixture_topk(zk: torch.Tensor, zt: torch.Tensor, ti: torch.Tensor, lp: torch.Tensor, known: torch.Tensor,
                  is_known: torch.Tensor, tau: float, lam: float, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k (ids, log-probs) of the mixture for one chunk from the shortlist (see :func:`_shortlist`).

    zk (n, V_r) known tokens' scores, zt / ti (n, m) shortlist scores / ids, lp (n, V_r + 1) classifier
    log-probs (known tokens, then <unk>). An unknown token's mixture probability grows with its similarity,
    so the best unknown tokens are the best unknown entries of the shortlist; known tokens are scored exactly.
    A row whose shortlist holds no unknown token (frequent once the classifier knows thousands of tokens)
    has nowhere in the shortlist to put its <unk> mass: that mass is dropped (it belongs to dissimilar
    tokens outside the shortlist), and every log-probability stays finite or -inf, never NaN (dividing by
    the empty sum used to give NaN there, which ``topk`` ranks first).
    """
    zk, zt = zk / tau, zt / tau
    oov = ~is_known[ti]  # (n, m) shortlist entries the classifier does not know
    zo = zt.masked_fill(~oov, float("-inf"))
    lse_oov = torch.logsumexp(zo, dim=1, keepdim=True)  # (n, 1); -inf when no shortlist entry is unknown
    lse_all = torch.logaddexp(torch.logsumexp(zk, dim=1, keepdim=True), lse_oov)
    log_lam = float(np.log(lam)) if lam > 0 else float("-inf")
    log_rest = float(np.log1p(-lam)) if lam < 1 else float("-inf")
    known_lp = torch.logaddexp(log_lam + lp[:, :-1], log_rest + zk - lse_all)  # (n, V_r)
    has_oov = torch.isfinite(lse_oov)  # (n, 1)
    unk_share = torch.where(has_oov, log_lam + lp[:, -1:] - lse_oov.masked_fill(~has_oov, 0.0), float("-inf"))
    oov_lp = (zo + torch.logaddexp(unk_share, log_rest - lse_all)).masked_fill(~oov, float("-inf"))  # (n, m)
    vals = torch.cat([known_lp, oov_lp], dim=1)
    ids = torch.cat([known.expand(len(zk), -1), ti], dim=1)
    best_v, best_i = vals.topk(k, dim=1)
    return ids.gather(1, best_i), best_v


def combine_topk(backoff: Any, y: torch.Tensor, logp: torch.Tensor, vocab: np.ndarray, tau: float, k: int,
                 lam: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Top-k over the full vocabulary of ``lam * p_cls' + (1 - lam) * p_emb``.

    ``p_cls'`` is the classifier (``logp`` (N, V_r + 1): known tokens ``vocab``, then <unk>) with its <unk>
    mass spread over unknown tokens by the embedding route; ``p_emb`` = softmax(z / tau) over the whole
    vocabulary, z the row-standardised similarity of the backoff's predicted embedding ``y`` (N, d_e).
    Returns (N, k) ids and log-probabilities.
    """
    known = torch.from_numpy(vocab)
    is_known = torch.zeros(int(backoff._embedding().shape[0]), dtype=torch.bool)
    is_known[known] = True
    ids_out, val_out = [], []
    for a in range(0, len(logp), _CHUNK):
        zk, zt, ti = _shortlist(backoff, y[a: a + _CHUNK], known)
        i, v = _mixture_topk(zk, zt, ti, logp[a: a + _CHUNK], known, is_known, tau, lam, k)
        ids_out.append(i.numpy())
        val_out.append(v.numpy())
    return np.concatenate(ids_out), np.concatenate(val_out)


def choose(backoff: Any, val: Taps, logp: torch.Tensor, vocab: np.ndarray,
           max_tokens: int = 1000) -> tuple[float, float, dict[str, float]]:
    """(tau, lam) from :data:`TAUS` x :data:`LAMS` with the best validation top-1 (ties: the earlier)."""
    n = min(max_tokens, val.n_tokens)
    y = backoff.predict_embedding(val.select_tokens(np.arange(n)))
    truth, logp = torch.from_numpy(val.token_ids[:n]), logp[:n]
    known = torch.from_numpy(vocab)
    is_known = torch.zeros(int(backoff._embedding().shape[0]), dtype=torch.bool)
    is_known[known] = True
    hits = {(t, m): 0 for m in LAMS for t in TAUS}
    for a in range(0, n, _CHUNK):
        zk, zt, ti = _shortlist(backoff, y[a: a + _CHUNK], known)
        for (t, m) in hits:
            ids, _ = _mixture_topk(zk, zt, ti, logp[a: a + _CHUNK], known, is_known, t, m, 1)
            hits[(t, m)] += int((ids[:, 0] == truth[a: a + _CHUNK]).sum())
    order = list(hits)
    tau, lam = max(order, key=lambda key: (hits[key], -order.index(key)))
    return tau, lam, {f"tau={t},lam={m}": h / n for (t, m), h in hits.items()}


def state(backoff: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    tensors, st = backoff._state()
    return {f"backoff.{k}": v for k, v in tensors.items()}, backoff.config() | {"state": st}


def load(model: Any, tensors: dict[str, Any], cfg: dict[str, Any], owner: str) -> Any:
    from attacks.registry import make_attack

    if model is None:
        raise AttackError(f"attack {owner!r} was trained with the embedding backoff and needs the model's embedding "
                          "matrix; load it with model=load_model(<spec>) (the spec its checkpoint records)")
    b = make_attack(cfg["recipe"], model=model, seed=cfg.get("seed", 0), **cfg["hparams"])
    b.meta.update(cfg.get("meta", {}))
    b.fit_report = dict(cfg.get("fit_report", {}))
    b._load_state({k[8:]: v for k, v in tensors.items() if k.startswith("backoff.")}, cfg["state"])
    b.fitted = True
    return b
