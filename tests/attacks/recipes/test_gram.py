"""Inner-product matching without the basis (attacks.recipes._gram) on hand-made states."""

from __future__ import annotations

import numpy as np
import torch

from attacks.recipes._align import procrustes
from attacks.recipes._gram import gram_decode, gram_distance, invariant_features, pick


def _rotation(d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return q


def test_the_features_do_not_see_a_common_rotation():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 16, generator=g, dtype=torch.float64)
    pool = torch.randn(9, 16, generator=g, dtype=torch.float64)
    q = _rotation(16, 1)
    assert torch.allclose(invariant_features(x @ q, pool @ q), invariant_features(x, pool), atol=1e-10)


def test_the_true_candidate_is_at_rounding_and_the_rest_far():
    g = torch.Generator().manual_seed(2)
    d = 32
    q = _rotation(d, 3)
    pool_h = torch.randn(20, d, generator=g, dtype=torch.float64)
    cand = torch.randn(6, d, generator=g, dtype=torch.float64)  # row 4 is the truth
    y = (cand[4] @ q).half().double()  # on an fp16 wire
    dist = gram_distance(cand, y, pool_h, (pool_h @ q).half().double())
    assert float(dist[4]) < 1e-3 and float(dist[torch.arange(6) != 4].min()) > 100 * float(dist[4])
    assert pick(dist, 1e-3, 0.1) == 4
    assert pick(dist, float(dist[4]) / 2, 0.1) is None  # over the tolerance: nothing
    tie = torch.tensor([1e-5, 2e-5, 1.0])
    assert pick(tie, 1e-3, 0.1) is None  # ambiguous: nothing


class _Toy:
    """States that depend on the token and its prefix: h_t = E[x_t] + 0.5 * mean(E[x_<t])."""

    def __init__(self, vocab: int = 40, d: int = 12, seed: int = 4):
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.randn(vocab, d, generator=g, dtype=torch.float64)
        self.prefix: list[int] = []

    def state(self, tokens: torch.Tensor, prefix: list[int]) -> torch.Tensor:
        ctx = self.emb[prefix].mean(0) if prefix else torch.zeros(self.emb.shape[1], dtype=torch.float64)
        return self.emb[tokens] + 0.5 * ctx  # (B, d)

    def start(self) -> None:
        self.prefix = []

    def states(self, tokens: torch.Tensor, t: int) -> torch.Tensor:
        assert t == len(self.prefix)
        return self.state(tokens, self.prefix)

    def commit(self, token: int, t: int) -> torch.Tensor:
        h = self.state(torch.tensor([token]), self.prefix)[0]
        self.prefix.append(token)
        return h


def _sequences(toy: _Toy, q: torch.Tensor, n: int, length: int, public: int, seed: int):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = rng.integers(0, len(toy.emb), length)
        h = torch.stack([toy.state(torch.tensor([int(ids[t])]), [int(i) for i in ids[:t]])[0] for t in range(length)])
        known = np.where(np.arange(length) < public, ids, -1)
        out.append(((h @ q).half().double().numpy(), known, ids))
    return out


def test_decoding_grows_the_pool_until_procrustes_gives_the_basis():
    toy, q = _Toy(), _rotation(12, 5)
    seqs = _sequences(toy, q, n=6, length=10, public=3, seed=0)
    every = np.arange(len(toy.emb))
    pool = gram_decode([(y, k) for y, k, _ in seqs], toy.start, lambda est: iter([every]), toy.states, toy.commit,
                       target=10_000, tol=1e-3, ratio=0.1, min_pool=3)  # the first session's 3 public rows
    assert pool.decoded == sum(int((k < 0).sum()) for _, k, _ in seqs) and pool.stopped == 0
    h, y = pool.tensors()
    assert torch.allclose(procrustes(h, y), q, atol=1e-2)  # fp16 wire: Q to wire precision


def test_a_missing_candidate_ends_the_sequence_and_a_full_pool_ends_the_run():
    toy, q = _Toy(), _rotation(12, 6)
    seqs = _sequences(toy, q, n=4, length=10, public=3, seed=1)
    truth = int(seqs[1][2][5])  # sequence 1, position 5 (after 3 public rows and 2 decoded ones)
    without = np.array([v for v in range(len(toy.emb)) if v != truth])
    pool = gram_decode([(y, k) for y, k, _ in seqs[:2]], toy.start, lambda est: iter([without]), toy.states, toy.commit,
                       target=10_000, tol=1e-3, ratio=0.1, min_pool=4)
    assert pool.stopped >= 1 and pool.sequences == 2
    assert pool.decoded < sum(int((k < 0).sum()) for _, k, _ in seqs[:2])
    every = np.arange(len(toy.emb))
    small = gram_decode([(y, k) for y, k, _ in seqs], toy.start, lambda est: iter([every]), toy.states, toy.commit,
                        target=12, tol=1e-3, ratio=0.1, min_pool=4)
    assert len(small) == 12 and small.sequences < 4


def test_user_rows_wait_for_the_pool():
    toy, q = _Toy(), _rotation(12, 7)
    seqs = _sequences(toy, q, n=1, length=6, public=0, seed=2)  # no public lead: nothing to test against
    pool = gram_decode([(y, k) for y, k, _ in seqs], toy.start, lambda est: iter([np.arange(40)]), toy.states,
                       toy.commit, target=100, tol=1e-3, ratio=0.1, min_pool=4)
    assert len(pool) == 0 and pool.stopped == 1


def test_a_second_tier_is_tried_when_the_first_has_no_match():
    toy, q = _Toy(), _rotation(12, 8)
    seqs = _sequences(toy, q, n=3, length=10, public=3, seed=3)
    every = np.arange(len(toy.emb))
    tiers = []

    def candidates(estimate):
        tiers.append(1)
        yield every[:5]  # almost never the truth
        tiers.append(2)
        yield every[5:]

    pool = gram_decode([(y, k) for y, k, _ in seqs], toy.start, candidates, toy.states, toy.commit,
                       target=10_000, tol=1e-3, ratio=0.1, min_pool=3)
    assert pool.stopped == 0 and pool.decoded == 21 and tiers.count(2) > 0


def test_the_estimate_is_the_projection_on_the_pools_span():
    from attacks.recipes._gram import GramPool

    g = torch.Generator().manual_seed(9)
    d, q = 10, _rotation(10, 9)
    pool = GramPool()
    basis = torch.randn(4, d, generator=g, dtype=torch.float64)  # the pool spans 4 of 10 dimensions
    for _ in range(12):
        h = torch.randn(4, generator=g, dtype=torch.float64) @ basis
        pool.h.append(h)
        pool.y.append(h @ q)
    x = torch.randn(d, generator=g, dtype=torch.float64)
    proj = basis.T @ torch.linalg.lstsq(basis.T, x[:, None]).solution[:, 0]  # x's projection on the span
    assert torch.allclose(pool.estimate(x @ q), proj, atol=1e-8)
