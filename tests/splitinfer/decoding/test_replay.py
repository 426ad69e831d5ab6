import pytest

from splitinfer.client import SplitModel
from splitinfer.decoding.base import DecodingEnv, make_proposer
from splitinfer.decoding.replay import replay, tau, top_tokens_of
from splitinfer.errors import SplitInferError

PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat"
CASES = [
    ("ngram-pool", {"ngram": 3}),
    ("prompt-lookup", {}),
    ("suffix", {}),
    ("combined", {"step_ms": 50.0, "token_ms": 1.0}),
]


def _topk(tiny, proposer, prompt, output):
    """The model's top-k rows the verifier hands a proposer that asks for them (token-recycling in combined)."""
    k = proposer.feedback_topk
    return top_tokens_of(tiny.model, prompt, output, k) if k else None


@pytest.mark.parametrize("name,options", CASES)
def test_replay_takes_the_same_steps_as_the_real_verifier(tiny, name, options):
    sm = SplitModel(tiny, "2,2", wire_dtype="fp32")
    ids = sm.encode_prompt(PROMPT)
    res = sm.generate(ids, 48, stop_on_eos=False, decoding=make_proposer(name, **options))
    proposer = make_proposer(name, **options)
    topk = _topk(tiny, proposer, ids, res.token_ids)
    steps = replay(proposer, ids, res.token_ids, 48, DecodingEnv(vocab_size=259), topk=topk)
    assert [s.tokens_committed for s in steps] == [s.tokens_committed for s in res.steps]
    assert [s.tokens_sent for s in steps] == [s.tokens_sent for s in res.steps]
    assert tau(steps) == pytest.approx(res.tokens_per_step)


def test_replay_refuses_proposers_that_need_model_outputs():
    with pytest.raises(SplitInferError, match="cannot be replayed"):
        replay(make_proposer("jacobi"), [1, 2], [3], 4, DecodingEnv(vocab_size=10))


def test_replay_on_a_repetitive_output_accepts_whole_chains():
    prompt = [1, 2, 3, 4, 5, 6]
    output = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6]
    steps = replay(make_proposer("prompt-lookup", draft_budget=10), prompt, output, 12, DecodingEnv(vocab_size=10))
    # prefill emits 1; "1" matches the prompt's start: 2..6 1 drafted (all the context has), all right,
    # + bonus 2; then "1 2" matches: 3 4 5 drafted + bonus 6
    assert [s.tokens_committed for s in steps] == [1, 7, 4]


def test_replay_matches_across_prompts_with_eos_inside_drafts(tiny, monkeypatch):
    """One combined instance over several prompts, generation stopping at an EOS the drafts run past:
    what the proposer learns at the last step must match between the verifier and the replay."""
    sm = SplitModel(tiny, "2,2", wire_dtype="fp32")
    prompts = [sm.encode_prompt(p) for p in (PROMPT, "ab ab ab ab ab ab", PROMPT)]
    full = sm.generate(prompts[0], 40, stop_on_eos=False).token_ids
    monkeypatch.setattr(tiny.model.generation_config, "eos_token_id", full[12])
    options = {"step_ms": 50.0, "token_ms": 0.5}
    real, rep = make_proposer("combined", **options), make_proposer("combined", **options)
    env = DecodingEnv(vocab_size=259, eos_ids=frozenset({full[12]}), max_new_tokens=40)
    for ids in prompts:
        res = sm.generate(ids, 40, decoding=real)
        steps = replay(rep, ids, res.token_ids, 40, env, topk=_topk(tiny, rep, ids, res.token_ids))
        assert [s.tokens_committed for s in steps] == [s.tokens_committed for s in res.steps]
        assert [s.tokens_sent for s in steps] == [s.tokens_sent for s in res.steps]


def test_a_rule_that_drafts_at_prefill_commits_its_draft_in_the_first_step():
    """transformers' rule (``at_prefill``): the prompt's final bigram 1 2 occurred at its start, so 3 4 1 2 is
    drafted with the prompt; 3 4 are right, 9 is the bonus: three tokens from the prefill forward."""
    prompt, output = [1, 2, 3, 4, 1, 2], [3, 4, 9, 8, 7]
    opts = {"ngram": 2, "draft_budget": 10, "occurrence": "first"}
    env = DecodingEnv(vocab_size=10)
    steps = replay(make_proposer("prompt-lookup", **opts, at_prefill=True), prompt, output, 5, env)
    assert steps[0].tokens_committed == 3 and steps[0].draft_accepted == 2 and steps[0].tokens_sent == 6 + 4
    assert sum(s.tokens_committed for s in steps) == 5
    plain = replay(make_proposer("prompt-lookup", **opts), prompt, output, 5, env)
    assert plain[0].tokens_committed == 1 and len(plain) > len(steps)
    assert len(replay(make_proposer("prompt-lookup", **opts, at_prefill=True), prompt, output[:1], 1, env)) == 1
    two = replay(make_proposer("prompt-lookup", **opts, at_prefill=True), prompt, output[:2], 2, env)
    assert [s.tokens_committed for s in two] == [2] and two[0].tokens_sent == 6 + 1  # the draft cut to the budget


def test_the_split_runtime_refuses_a_prefill_draft(tiny):
    from splitinfer.client import make_decoding

    sm = SplitModel(tiny, "2,2", wire_dtype="fp32")
    with pytest.raises(SplitInferError, match="drafts at prefill"):
        sm.generate(sm.encode_prompt(PROMPT), 4, decoding=make_proposer("prompt-lookup", at_prefill=True))
    with pytest.raises(SplitInferError, match="drafts at prefill"):
        make_decoding("prompt-lookup", {"at_prefill": True})
    with pytest.raises(SplitInferError, match="at_prefill='yes' must be true or false"):
        make_proposer("prompt-lookup", at_prefill="yes")
