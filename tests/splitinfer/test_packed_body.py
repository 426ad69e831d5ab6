"""Several sessions' body steps as one packed forward (:mod:`splitinfer.packed_body`) against one forward each."""

from __future__ import annotations

import copy

import pytest
import torch

from splitinfer import batch_invariant as bi
from splitinfer.decoding.tree import depths
from splitinfer.kv_cache import PartKVCache
from splitinfer.packed_body import BodyStep, packed_mask, run_packed
from splitinfer.partition import SplitConfig, split_model

PREFIX = [5, 9, 1, 0]  # cached positions per session (0: a prefill in the same batch)
STEPS = [(1, None), (4, [-1, 0, 0, 1]), (3, None), (6, None)]  # rows and tree parents of each session's step


@pytest.fixture(scope="module")
def bodies(tiny):
    _, body, _ = split_model(tiny.model, SplitConfig(2, 2))
    _, bi_body, _ = split_model(copy.deepcopy(tiny.model), SplitConfig(2, 2))  # its own config: tiny stays stock
    bi.enable(bi_body)
    return {"default": body, "batch-invariant": bi_body}


def _sessions(body, seed: int):
    """Caches holding PREFIX positions each, and the next step of each session (same for a given seed)."""
    gen = torch.Generator().manual_seed(seed)
    d = body.config.hidden_size
    caches, steps = [], []
    for cached, (rows, parents) in zip(PREFIX, STEPS):
        cache = PartKVCache()
        if cached:
            body(torch.randn(1, cached, d, generator=gen), torch.arange(cached), cache)
        pos = torch.arange(cached, cached + rows) if parents is None else torch.tensor(
            [cached + x for x in depths(parents)])
        steps.append(BodyStep(torch.randn(1, rows, d, generator=gen), pos, cache, parents))
        caches.append(cache)
    return steps


@pytest.mark.parametrize("kernels", ["default", "batch-invariant"])
def test_packed_forward_matches_one_forward_per_session(bodies, kernels):
    body = bodies[kernels]
    alone = [body(s.hidden, s.positions, s.cache, s.parents) for s in _sessions(body, 0)]
    packed_steps = _sessions(body, 0)
    packed = run_packed(body, packed_steps)
    reference = _sessions(body, 0)
    for s in reference:
        body(s.hidden, s.positions, s.cache, s.parents)
    for a, p, ref, got in zip(alone, packed, reference, packed_steps):
        assert p.shape == a.shape
        assert torch.equal(ref.cache.positions, got.cache.positions)
        if kernels == "batch-invariant":  # bit for bit: states and caches
            assert torch.equal(a, p)
            assert all(torch.equal(ref.cache.keys[k], got.cache.keys[k]) for k in ref.cache.keys)
            assert all(torch.equal(ref.cache.values[k], got.cache.values[k]) for k in ref.cache.values)
        else:  # float32 noise of another reduction order
            assert (a - p).abs().max() < 1e-4


def test_mask_is_block_diagonal_and_each_block_is_the_sessions_own(bodies):
    steps = _sessions(bodies["default"], 1)
    mask = packed_mask(steps, None)[0, 0]  # (sum T, sum S+T)
    assert mask.shape == (sum(r for r, _ in STEPS), sum(PREFIX) + sum(r for r, _ in STEPS))
    row = col = 0
    for cached, (rows, parents) in zip(PREFIX, STEPS):
        block = mask[row:row + rows, col:col + cached + rows]
        assert block[:, :cached].all()  # the whole cache
        if parents is None:
            assert torch.equal(block[:, cached:], torch.ones(rows, rows, dtype=torch.bool).tril())
        else:  # the tree: node 3's parent is node 1, whose parent is the root
            assert block[3, cached:].tolist() == [True, True, False, True]
        assert not mask[row:row + rows, :col].any() and not mask[row:row + rows, col + cached + rows:].any()
        row, col = row + rows, col + cached + rows
