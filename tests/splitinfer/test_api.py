"""splitinfer.api: the documented facade runs end to end on the tiny model, and names only what exists."""

from __future__ import annotations

import numpy as np

from splitinfer import api


def test_the_facade_covers_a_script_from_model_to_scored_attack():
    model = api.load_model("tiny-random")
    out = api.generate(api.split(model, "2,2"), "Hello there", max_new_tokens=6)
    assert len(out.token_ids) == 6
    train = api.extract_taps(model, "prose", "head:2", split="train", max_tokens=400, max_length=32)
    test = api.extract_taps(model, "prose", "head:2", split="test", max_tokens=200, max_length=32)
    assert train.hidden.shape == (train.n_tokens, model.hidden_size) and test.n_tokens > 0
    atk = api.train_attack("linear-probe", train, model=model, epochs=1)
    m = api.evaluate_attack(atk, test)
    assert 0.0 <= m["token_acc_top1"]["value"] <= 1.0 and m["token_acc_top1"]["n"] == test.n_tokens
    released = api.apply_defense("noise(sigma=0.5,clip=4.0)", test)
    assert released.hidden.shape == test.hidden.shape
    assert not np.allclose(np.asarray(released.hidden, dtype=np.float32), np.asarray(test.hidden, dtype=np.float32))
    comps = api.list_components()
    assert {"linear-probe", "noise", "sequential", "prose"} <= {n for v in comps.values() for n in v}


def test_every_public_name_exists_and_is_documented():
    for name in api.__all__:
        assert callable(getattr(api, name)) and getattr(api, name).__doc__
    assert "Deprecation rule" in api.__doc__
