"""shard-infill: one party of a token-sharded split sees every k-th position and fills the rest from the prior."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attacks.errors import AttackError
from attacks.registry import make_attack
from attacks.tapdata import Taps
from splitinfer.defenses.token_shard import cost_per_step, party_of
from tests.attacks.recipes._tiny_taps import tiny_head_taps


@pytest.fixture(scope="module")
def taps(tiny, tmp_path_factory):
    return tiny_head_taps(tiny, tmp_path_factory.mktemp("shard"))


def _attack(tiny, taps, **hp):
    return make_attack("shard-infill", model=tiny, beam=4, lm_top=8, proposer_tokens=2000, random_tokens=512,
                       **hp).fit(taps)


def test_the_party_never_reads_the_rows_it_does_not_hold(tiny, taps):
    atk = _attack(tiny, taps, shards=2)
    test = taps.select_sequences([0, 1]).truncate(8)
    seen = atk.visible_rows(test)
    assert seen.tolist() == [party_of(int(t), 2) == 0 for t in test.positions()] and 0 < seen.sum() < len(seen)
    rng = np.random.default_rng(0)
    scrambled = np.where(seen[:, None], test.hidden, rng.normal(size=test.hidden.shape).astype(np.float32))
    other = Taps(scrambled, test.token_ids, test.seq_lengths, test.seq_doc, test.documents, test.offsets, test.meta)
    a, b = atk.invert(test, k=3), atk.invert(other, k=3)
    assert np.array_equal(a.topk, b.topk)
    assert a.info["rows_seen"] == int(seen.sum()) and a.info["shards"] == 2


def _greedy_taps(tiny, like: Taps, n: int) -> Taps:
    """Head-2 taps of the tiny model's own greedy text from its BOS: text its prior predicts exactly."""
    from attacks.taps import TruncatedForward

    start = tiny.tokenizer.bos_token_id
    with torch.no_grad():
        ids = tiny.model.generate(torch.tensor([[start]]), max_new_tokens=n, do_sample=False)[0, 1:]  # (n,)
        hidden = TruncatedForward(tiny.model, 2).eval()(ids[None])[0].float().numpy()  # (n, d)
    return Taps(hidden, ids.numpy().astype(like.token_ids.dtype), np.array([n]), np.array([0]),
                [{"doc_id": "greedy", "text": ""}], None, like.meta)


def test_gaps_the_prior_predicts_are_filled_and_every_seen_position_then_matches(tiny, taps):
    test = _greedy_taps(tiny, taps, 13)  # its last position (12) is one that parties 0 of 2 and of 3 see
    for shards in (2, 3):
        atk = _attack(tiny, taps, shards=shards)
        inv, seen = atk.invert(test, k=1), atk.visible_rows(test)
        assert (inv.tokens == test.token_ids).all() and 0 < seen.sum() < len(seen)


def test_bad_options_are_attack_errors():
    with pytest.raises(AttackError, match="shards=1"):
        make_attack("shard-infill", shards=1)
    with pytest.raises(AttackError, match="party=3"):
        make_attack("shard-infill", shards=3, party=3)
    with pytest.raises(AttackError, match="lam=-1"):
        make_attack("shard-infill", lam=-1)


def test_the_exchange_a_sharded_step_needs_grows_with_layers_and_parties():
    two = cost_per_step(body_layers=26, shards=2, hidden=576, heads=9)
    four = cost_per_step(body_layers=26, shards=4, hidden=576, heads=9)
    assert two["sequential_hops_between_parties"] == four["sequential_hops_between_parties"] == 52
    assert four["bytes_between_parties"] == 3 * two["bytes_between_parties"] == 3 * 26 * (2 * 576 + 18) * 2
    with pytest.raises(ValueError):
        cost_per_step(body_layers=26, shards=1, hidden=576, heads=9)
