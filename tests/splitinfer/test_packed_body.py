"""Several sessions' body steps as one packed forward (:mod:`splitinfer.packed_body`) against one forward each."""

from __future__ import annotations

import copy

import pytest
import torch

from splitinfer import batch_invariant as bi
from splitinfer.decoding.tree import depths
from splitinfer.kv_cache import PartKVCache
from splitinfer.packed_body import PACKED_ATTENTION, BodyStep, run_packed
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


def test_one_sessions_overflow_never_reaches_another(bodies):
    """Issue 30, finding 1: a session whose cache holds Inf (an fp16 overflow) must not turn the others' rows
    into NaN. With the old block-diagonal mask over all sessions' keys, 0 x Inf/NaN reached every row."""
    body = bodies["default"]
    alone = [body(s.hidden, s.positions, s.cache, s.parents) for s in _sessions(body, 2)]
    steps = _sessions(body, 2)
    poisoned = steps[1].cache
    for layer in poisoned.keys:  # as if an earlier step had overflowed in this session alone
        poisoned.keys[layer] = torch.full_like(poisoned.keys[layer], float("inf"))
        poisoned.values[layer] = torch.full_like(poisoned.values[layer], float("nan"))
    packed = run_packed(body, steps)
    assert not torch.isfinite(packed[1]).all()  # the poisoned session itself
    for i in (0, 2, 3):
        assert torch.isfinite(packed[i]).all()
        assert (packed[i] - alone[i]).abs().max() < 1e-4


def test_packed_attention_is_switched_off_after_the_forward_even_on_error(bodies):
    body = bodies["default"]
    before = body.config._attn_implementation
    run_packed(body, _sessions(body, 3))
    assert body.config._attn_implementation == before != PACKED_ATTENTION
    steps = _sessions(body, 3)
    steps[0].cache.max_len = 1  # refuses to grow: the forward raises midway
    with pytest.raises(Exception, match="exceeds"):
        run_packed(body, steps)
    assert body.config._attn_implementation == before
