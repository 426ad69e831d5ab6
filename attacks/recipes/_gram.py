"""Matching released states ``y = h Q`` without knowing the orthogonal Q: inner products are invariant.

For any orthogonal Q, ``<h_t Q, h_s Q> = <h_t, h_s>`` and ``||h_t Q|| = ||h_t||``. An attacker that holds pairs
``(h_s, y_s)`` whose tokens it knows (the "pool": public positions such as an added BOS or a chat template,
whose states depend on public tokens only, and every position it has decoded so far, in any session of the
deployment, since Q is the same for all) can test a candidate token at a new position without Q: the public
state ``h_v`` the candidate gives under the decoded prefix must have the same inner products with the pool's
public states as the observed ``y_t`` has with the pool's released states, and the same norm, to wire
rounding (:func:`gram_distance`). A wrong token misses by orders of magnitude more, so a match is accepted
only when it is both under ``tol`` and far below the runner-up (:func:`pick`).

Decoding goes left to right within a sequence (a candidate's state needs the decoded prefix). The caller's
candidates come in tiers tried in turn: in the attacker, the public model's next-token top-C under the decoded
prefix, then a proposer's top-C on the observed state turned back as far as the pool allows
(:meth:`GramPool.estimate`: its projection on the pool's span, exact on that span). A position where no tier
passes ends the sequence (its later states need the missing token). Every accepted row joins the pool, so the
test sharpens as it goes; once the pool spans R^d, Procrustes on it gives Q to wire precision
(:func:`attacks.recipes._align.procrustes`) and matching is ordinary from there.

Our construction: the invariance of Gram matrices under orthogonal maps is classical; arXiv 2605.04901's
weight-free alignment (as described to us, not read) works from the states' statistics instead, which pin only
the leading directions of a Haar rotation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch


def invariant_features(x: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """(B, d) states, (n, d) pool states in the same basis -> (B, n + 1): the inner product with each pool
    state's unit vector, then the norm. Unchanged when x and pool are turned by the same orthogonal map."""
    unit = pool / pool.norm(dim=1, keepdim=True).clamp_min(1e-12)  # (n, d)
    return torch.cat([x @ unit.T, x.norm(dim=1, keepdim=True)], dim=1)


def gram_distance(cand: torch.Tensor, y: torch.Tensor, pool_h: torch.Tensor, pool_y: torch.Tensor) -> torch.Tensor:
    """(B, d) candidates' public states, (d,) observed released state, (n, d) pool public / released states ->
    (B,) RMS difference of the invariant features over ``||y||``: about wire rounding for the true token."""
    want = invariant_features(y[None].double(), pool_y.double())  # (1, n + 1)
    got = invariant_features(cand.double(), pool_h.double())  # (B, n + 1)
    return (got - want).pow(2).mean(dim=1).sqrt() / y.double().norm().clamp_min(1e-12)


def pick(dist: torch.Tensor, tol: float, ratio: float) -> int | None:
    """(B,) distances -> the index of the one accepted match, or None: the best must be under ``tol`` and under
    ``ratio`` x the runner-up (an ambiguous test accepts nothing)."""
    if not len(dist):
        return None
    order = torch.argsort(dist)
    best = float(dist[order[0]])
    second = float(dist[order[1]]) if len(dist) > 1 else float("inf")
    return int(order[0]) if best < tol and best < ratio * second else None


@dataclass
class GramPool:
    """The decoded pairs: public states ``h`` and released states ``y`` (float64 rows), and what was decoded."""

    h: list[torch.Tensor] = field(default_factory=list)
    y: list[torch.Tensor] = field(default_factory=list)
    decoded: int = 0  # user-text rows accepted by matching
    public: int = 0  # public rows taken as known
    sequences: int = 0  # sequences started
    stopped: int = 0  # sequences ended early (no candidate passed)
    _stacked: tuple[torch.Tensor, torch.Tensor] | None = None
    _back: tuple[int, torch.Tensor] | None = None  # (pool size it was made at, (d, d) released -> public map)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(n, d), (n, d) float64: the pool's public and released states."""
        if self._stacked is None or len(self._stacked[0]) != len(self.h):
            self._stacked = torch.stack(self.h), torch.stack(self.y)
        return self._stacked

    def estimate(self, y: torch.Tensor, rcond: float = 1e-3, refresh: float = 0.1) -> torch.Tensor:
        """(d,) released state -> (d,) its public state projected on the span of the pool's public states.

        With ``Y = U S V^T`` (the pool's released states, singular values under ``rcond`` x the largest dropped:
        they would amplify the wire's rounding), the coefficients ``c = U S^-1 V^T y`` express y in the pool's
        rows and ``H^T c`` is the public state's projection: the map ``H^T U S^-1 V^T`` is Q^-1 on that span.
        It is rebuilt when the pool has grown by ``refresh`` since (the estimate is a ranking aid only)."""
        n = len(self.h)
        if self._back is None or n > (1 + refresh) * self._back[0]:
            h, ys = self.tensors()
            u, sv, vh = torch.linalg.svd(ys, full_matrices=False)  # (n, r), (r,), (r, d)
            keep = sv > rcond * sv[0]
            self._back = n, h.T @ (u[:, keep] / sv[keep]) @ vh[keep]  # (d, d)
        return self._back[1] @ y.double()

    def __len__(self) -> int:
        return len(self.h)


def gram_decode(sequences: Iterable[tuple[np.ndarray, np.ndarray]], start: Callable[[], None],
                candidates: Callable[[Callable[[], torch.Tensor]], Iterator[np.ndarray]],
                states: Callable[[torch.Tensor, int], torch.Tensor],
                commit: Callable[[int, int], torch.Tensor], target: int, tol: float, ratio: float,
                min_pool: int = 8) -> GramPool:
    """Decode rows left to right until the pool holds ``target`` rows.

    sequences: per sequence, ``(y (T, d) released states, known (T,) public token id or -1)``;
    start(): a new sequence (the caller resets its prefix cache and language model);
    candidates(estimate) -> tiers of (C,) token ids to try at the next position, in turn until one passes;
    ``estimate()`` gives the position's public state as far as the pool knows it (:meth:`GramPool.estimate`);
    states(tokens (C,), t) -> (C, d) their public states at position t under the decoded prefix;
    commit(token, t) -> (d,) the chosen token's public state at t, now part of the prefix.
    Public rows join the pool as known pairs; a user-text row is matched once the pool holds ``min_pool`` rows.
    """
    pool = GramPool()
    seen_public: set[tuple[int, ...]] = set()  # a public row's token prefix: identical rows join the pool once
    for y, known in sequences:
        if len(pool) >= target:
            break
        start()
        pool.sequences += 1
        prefix: list[int] = []
        for t in range(len(y)):
            if len(pool) >= target:
                break
            obs = torch.as_tensor(y[t], dtype=torch.float64)  # (d,)
            if known[t] >= 0:
                tok = int(known[t])
                h = commit(tok, t)
                key = (*prefix, tok)
                if key not in seen_public:
                    seen_public.add(key)
                    pool.h.append(h.double().cpu())
                    pool.y.append(obs)
                    pool.public += 1
                prefix.append(tok)
                continue
            if len(pool) < min_pool:
                pool.stopped += 1
                break
            ph, py = pool.tensors()
            tok = None
            for tier in candidates(lambda o=obs: pool.estimate(o)):
                cand = np.asarray(tier, dtype=np.int64)  # (C,)
                j = pick(gram_distance(states(torch.from_numpy(cand), t).double().cpu(), obs, ph, py), tol, ratio)
                if j is not None:
                    tok = int(cand[j])
                    break
            if tok is None:
                pool.stopped += 1
                break
            pool.h.append(commit(tok, t).double().cpu())
            pool.y.append(obs)
            pool.decoded += 1
            prefix.append(tok)
    return pool
