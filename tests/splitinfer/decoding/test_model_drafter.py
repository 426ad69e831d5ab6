"""What local-draft and feature-draft share through ModelDrafter: the sizing options, and no replay without the model."""

import pytest

from splitinfer.decoding.base import DecodingEnv, make_proposer
from splitinfer.decoding.replay import replay
from splitinfer.errors import SplitInferError

DRAFTERS = ["local-draft", "feature-draft"]


def sources_with(name: str) -> str:
    """``combined`` sources that include the model drafter ``name``."""
    return f"suffix,prompt-lookup,ngram-pool,{name}"


@pytest.mark.parametrize("name", DRAFTERS)
@pytest.mark.parametrize("options,match", [
    ({"draft_budget": 0}, "draft_budget must be an integer >= 1"),
    ({"step_ms": 10.0}, "both step_ms and token_ms"),
    ({"window": 3}, "does not take option"),
])
def test_bad_shared_options_are_named(name, options, match):
    with pytest.raises(SplitInferError, match=match):
        make_proposer(name, **options)


@pytest.mark.parametrize("name", DRAFTERS)
def test_it_cannot_be_replayed_or_run_without_the_local_model(name):
    env = DecodingEnv(vocab_size=50)
    for p in (make_proposer(name), make_proposer("combined", sources=sources_with(name))):
        with pytest.raises(SplitInferError, match="local model"):
            replay(p, [1, 2, 3], [4, 5, 6], 3, env)
    with pytest.raises(SplitInferError, match="drafts with the local model"):
        make_proposer(name).begin([1, 2], env)


def test_the_default_combined_stays_replayable():
    assert not make_proposer("combined").needs_model


@pytest.mark.parametrize("name", [*DRAFTERS, "combined"])
def test_the_sizing_options_are_declared_once_and_reach_the_proposer(name):
    from dataclasses import fields

    from splitinfer.decoding.base import SizingOptions, proposer_options

    options = proposer_options(name)
    assert {f.name: f.default for f in fields(SizingOptions)}.items() <= options.items()
    p = make_proposer(name, adaptive=False, decay=0.5, step_ms=3.0, token_ms=0.5)
    assert p.adaptive is False and p.decay == 0.5 and p.cost.coefficients() == (3.0, 0.5)
