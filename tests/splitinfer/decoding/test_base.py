import pytest

from splitinfer.decoding.base import Draft, Proposer, list_proposers, make_proposer, proposer_options, register_proposer
from splitinfer.errors import SplitInferError

ALL = ["combined", "feature-draft", "jacobi", "local-draft", "lookahead", "ngram-pool", "prompt-lookup", "rest",
       "sequential", "suffix", "suffix-automaton", "token-recycling"]


def test_draft_validation_and_chain():
    assert Draft.chain([5, 6, 7]).parents == (-1, 0, 1)
    assert len(Draft()) == 0
    with pytest.raises(SplitInferError, match="parents"):
        Draft((1, 2), (-1,))
    with pytest.raises(SplitInferError, match="entry 1"):
        Draft((1, 2), (-1, 1))


def test_registry_lists_and_builds_every_proposer():
    assert list_proposers() == ALL
    for name in ALL:
        p = make_proposer(name)
        assert isinstance(p, Proposer) and p.name == name


def test_bad_names_and_options_are_named():
    with pytest.raises(SplitInferError, match="unknown decoding 'nope'.*sequential"):
        make_proposer("nope")
    with pytest.raises(SplitInferError, match="does not take option.*window.*ngram="):
        make_proposer("ngram-pool", window=3)
    with pytest.raises(SplitInferError, match="ngram must be an integer >= 2"):
        make_proposer("ngram-pool", ngram=1)
    assert make_proposer("ngram-pool", ngram=None).n == 5  # unset CLI flags fall back to defaults
    # options take their default's type before the proposer runs: "no" is not true, "abc" and NaN not a number
    for name, opts, needle in (("suffix", {"history": "no"}, "history='no' must be true or false"),
                               ("suffix", {"alpha": "abc"}, "alpha='abc' must be a finite number"),
                               ("jacobi", {"seed": "abc"}, "seed='abc' must be an integer"),
                               ("combined", {"step_ms": "abc", "token_ms": 1}, "step_ms='abc' must be a finite number"),
                               ("combined", {"rtt_ms": float("nan")}, "rtt_ms=nan must be a finite number >= 0"),
                               ("combined", {"step_ms": -1.0, "token_ms": 1.0}, "step_ms=-1.0 must be a finite"),
                               ("combined", {"decay": 1.5}, "decay=1.5 must be a number in (0, 1]"),
                               ("local-draft", {"draft_ms": float("nan")}, "draft_ms must be a number >= 0")):
        with pytest.raises(SplitInferError) as e:
            make_proposer(name, **opts)
        assert needle in str(e.value), (name, opts, str(e.value))
    assert proposer_options("lookahead")["window"] == 5


def test_register_rejects_duplicates_and_non_proposers():
    with pytest.raises(SplitInferError, match="already registered"):

        @register_proposer("sequential")
        class Other(Proposer):
            def propose(self, context):
                return Draft()

    with pytest.raises(SplitInferError, match="Proposer subclass"):
        register_proposer("x")(int)
