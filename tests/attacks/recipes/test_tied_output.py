"""output=tied (attacks/recipes/_tied.py): full-vocabulary logits through the public embedding matrix."""

from __future__ import annotations

import numpy as np
import pytest

from attacks.errors import AttackError
from attacks.recipes._tied import training_ids
from attacks.registry import load_attack, make_attack
from tests.attacks.synth import embedding_taps


def test_sampled_softmax_ids_keep_every_seen_token() -> None:
    ids = training_ids(np.array([3, 7]), 20, 5, seed=0)
    assert set(ids) >= {3, 7} and len(ids) == 7 and np.all(np.diff(ids) > 0)
    assert len(training_ids(np.array([3, 7]), 20, 100, seed=0)) == 20


@pytest.mark.parametrize("recipe, opts", [
    ("linear-probe", {"epochs": 40, "batch_size": 32, "lr": 0.01}),
    ("seq-decoder", {"epochs": 6, "batch_size": 8, "lr": 3e-3, "d_model": 32, "layers": 1, "heads": 2, "d_ff": 64,
                     "probe_epochs": 40}),
])
def test_tied_head_predicts_tokens_absent_from_training(tiny, tmp_path, recipe, opts) -> None:
    rng = np.random.default_rng(0)
    seen, unseen = np.arange(3, 200), np.arange(200, 250)
    train = embedding_taps(tiny, rng.choice(seen, 3000), seed=0)
    test = embedding_taps(tiny, rng.choice(unseen, 300), seed=1)
    tied = make_attack(recipe, model=tiny, output="tied", negatives=16, **opts).fit(train)
    acc = float((tied.invert(test).tokens == test.token_ids).mean())
    assert acc > 0.5  # every test token is absent from training
    restricted = make_attack(recipe, model=tiny, backoff="none", **opts).fit(train)
    assert not np.isin(restricted.invert(test).topk, unseen).any()  # capped by coverage
    again = load_attack(tied.save(tmp_path / recipe), model=tiny)
    assert np.array_equal(again.invert(test).topk, tied.invert(test).topk)


def test_tied_output_errors_are_one_line(tiny) -> None:
    with pytest.raises(AttackError, match="output='big'; choose restricted"):
        make_attack("linear-probe", output="big")
    with pytest.raises(AttackError, match="2 output heads; output=tied supports one"):
        make_attack("output-probe", output="tied")
    rng = np.random.default_rng(0)
    with pytest.raises(AttackError, match="output=tied needs the model's embedding matrix"):
        make_attack("linear-probe", output="tied").fit(embedding_taps(tiny, rng.choice(200, 100), seed=0))
