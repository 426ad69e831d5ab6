"""Estimating a secret orthogonal basis Q from released states alone: the pure linear algebra of
``vocab-match-aligned`` (:mod:`attacks.recipes.vocab_match_aligned`).

The victim releases ``y = h Q`` (``permute``: Q a signed permutation or a rotation, secret). An attacker without
the transformed body weights still has three things: the public model's own states ``P`` of public text (their
statistics: ``E[y^T y] = Q^T E[h^T h] Q``), the states of public positions it can compute exactly (a chat
template's leading tokens, an added BOS: ``y_k = a_k Q`` with ``a_k`` known, "anchors"), and, once a first
estimate decodes some of the text, the public states of its own guesses. Between the first estimate and the
decoded text sits Procrustes on mutual nearest neighbours, the refinement step of unsupervised embedding
alignment (Conneau et al., "Word Translation Without Parallel Data", arXiv 1710.04087).

Every function works on (rows, d) float64 tensors; states are row vectors, so ``y ~ h @ Q``.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment


def procrustes(h: torch.Tensor, y: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """(n, d) public states, (n, d) released states -> (d, d) orthogonal Q minimising sum_i w_i ||h_i Q - y_i||^2
    (Schoenemann 1966)."""
    hw = h if weights is None else h * weights[:, None]
    u, _, vh = torch.linalg.svd(hw.T @ y)  # (d, d)
    return u @ vh


def snap_signed(q: torch.Tensor) -> torch.Tensor:
    """(d, d) any matrix -> the signed permutation nearest to it in Frobenius norm (an assignment on |q|)."""
    rows, cols = linear_sum_assignment(-q.abs().cpu().numpy())
    sign = torch.sign(q[rows, cols])
    sign[sign == 0] = 1.0  # an exactly-zero entry keeps a + sign
    out = torch.zeros_like(q)
    out[rows, cols] = sign
    return out


def _profile(cov: torch.Tensor, top: int) -> torch.Tensor:
    """(d, d) second-moment matrix -> (d, top) each dimension's ``top`` largest |entries| (sign- and
    order-free: a signed permutation of the dimensions permutes these rows and nothing else)."""
    return cov.abs().sort(dim=1, descending=True).values[:, :top]


def signed_init(public: torch.Tensor, observed: torch.Tensor, anchors_pub: torch.Tensor | None = None,
                anchors_obs: torch.Tensor | None = None, top: int = 32) -> torch.Tensor:
    """Signed permutation Q with ``observed ~ public @ Q`` from per-dimension statistics and anchors.

    Dimension j of the public states is assigned to dimension i of the released ones by matching sign-free
    features: the top |entries| of its second-moment row (:func:`_profile`), its RMS, and its |value| in each
    anchor (exact, up to wire rounding); the sign is the one that agrees with the anchors, else with the mean.
    """
    feats = []
    for x in (public, observed):
        m2 = x.T @ x / len(x)  # (d, d)
        feats.append([_profile(m2, top), m2.diagonal().sqrt()[:, None]])
    if anchors_pub is not None and len(anchors_pub):
        feats[0].append(anchors_pub.abs().T)  # (d, K)
        feats[1].append(anchors_obs.abs().T)
    cost = torch.zeros(public.shape[1], observed.shape[1], dtype=torch.float64)
    for fp, fo in zip(*feats):
        scale = float(torch.cat([fp, fo]).pow(2).mean().clamp_min(1e-30))
        cost += torch.cdist(fp, fo).pow(2) / scale  # (d_pub, d_obs)
    rows, cols = linear_sum_assignment(cost.numpy())
    if anchors_pub is not None and len(anchors_pub):
        agree = (anchors_pub[:, rows] * anchors_obs[:, cols]).sum(0)  # (d,)
    else:
        agree = torch.zeros(len(rows), dtype=torch.float64)
    fallback = public.mean(0)[rows] * observed.mean(0)[cols]  # (d,) where the anchors say nothing
    sign = torch.where(agree != 0, torch.sign(agree), torch.sign(fallback))
    sign[sign == 0] = 1.0
    q = torch.zeros(public.shape[1], observed.shape[1], dtype=torch.float64)
    q[rows, cols] = sign
    return q


def eigen_init(public: torch.Tensor, observed: torch.Tensor, anchors_pub: torch.Tensor | None = None,
               anchors_obs: torch.Tensor | None = None) -> torch.Tensor:
    """Orthogonal Q with ``observed ~ public @ Q`` from the second moments' eigenvectors.

    ``E[y^T y] = Q^T E[h^T h] Q``, so the k-th eigenvectors satisfy ``u_k Q = +-v_k``: Q = sum_k s_k u_k^T v_k,
    each sign s_k the one under which the anchors (and the means) agree. Reliable only where the spectrum has
    gaps larger than the sampling error; the self-training refinement repairs the rest.
    """
    eig = []
    for x in (public, observed):
        _, vecs = torch.linalg.eigh(x.T @ x / len(x))  # ascending eigenvalues
        eig.append(vecs.flip(1))  # (d, d) columns by descending eigenvalue
    u, v = eig
    pub = public.mean(0, keepdim=True)
    obs = observed.mean(0, keepdim=True)
    if anchors_pub is not None and len(anchors_pub):
        pub, obs = torch.cat([pub, anchors_pub]), torch.cat([obs, anchors_obs])
    agree = ((pub @ u) * (obs @ v)).sum(0)  # (d,)
    sign = torch.sign(agree)
    sign[sign == 0] = 1.0
    return (u * sign[None]) @ v.T


def mutual_neighbours(a: torch.Tensor, b: torch.Tensor, chunk: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, d), (m, d) -> index pairs (i, j) where a_i and b_j are each other's nearest neighbour by cosine (the
    dictionary of each refinement step of unsupervised alignment, arXiv 1710.04087)."""
    bn = torch.nn.functional.normalize(b.float(), dim=1)  # (m, d)
    ab = torch.empty(len(a), dtype=torch.long)
    best_a = torch.full((len(b),), -2.0)
    ba = torch.zeros(len(b), dtype=torch.long)
    for lo in range(0, len(a), chunk):
        sim = torch.nn.functional.normalize(a[lo: lo + chunk].float(), dim=1) @ bn.T  # (c, m)
        ab[lo: lo + chunk] = sim.argmax(1)
        top, arg = sim.max(0)  # (m,)
        better = top > best_a
        best_a[better], ba[better] = top[better], arg[better] + lo
    i = torch.arange(len(a))
    mutual = ba[ab] == i
    return i[mutual], ab[mutual]


def fit_weights(h: torch.Tensor, y: torch.Tensor, q: torch.Tensor, quantile: float, spread: float = 2.0,
                among: torch.Tensor | None = None) -> torch.Tensor:
    """(n,) weights: 1 for rows whose ``h Q`` fits ``y`` within ``spread`` x the ``quantile`` of the relative errors
    of the rows ``among`` selects (all by default), else 0. Rows whose decoded token (or its prefix) is wrong fit
    far worse than right ones under a nearly right Q, so they are left out of the next Procrustes instead of
    pulling it towards a compromise. Public rows fit exactly under any Q that fits their few states, so the
    caller leaves them out of ``among``: the bound then follows the decoded rows."""
    err = relative_residual(h, y, q)  # (n,)
    pool = err if among is None or not bool(among.any()) else err[among]
    return (err <= spread * float(pool.quantile(quantile))).double()


def relative_residual(h: torch.Tensor, y: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(n,) ``||h Q - y|| / ||y||`` per row."""
    return (h @ q - y).norm(dim=1) / y.norm(dim=1).clamp_min(1e-12)
