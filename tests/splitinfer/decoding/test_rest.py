from splitinfer.decoding.base import DecodingEnv, make_proposer
from splitinfer.decoding.datastore import Datastore


def test_rest_drafts_the_most_frequent_continuations_of_the_longest_match():
    p = make_proposer("rest", min_match=2, min_prob=0.0, draft_budget=4, depth=3)
    p.store = Datastore([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [9, 2, 3, 7, 7]], width=8)
    p.begin([0], DecodingEnv(vocab_size=10))
    d = p.propose([0, 1, 2, 3])  # "1 2 3" matches twice, both followed by 4
    assert d.tokens[:2] == (4, 5) or d.tokens[:2] == (4, 6)
    assert d.tokens[0] == 4 and d.parents[0] == -1 and len(d) <= 4
    cands = p.candidates([0, 1, 2, 3])
    assert {c.tokens for c in cands} == {(4, 5), (4, 6)} and all(c.source == "rest" for c in cands)


def test_rest_drafts_nothing_below_min_match_or_without_a_datastore():
    p = make_proposer("rest", min_match=2)
    p.store = Datastore([[1, 2, 3]], width=8)
    p.begin([0], DecodingEnv(vocab_size=10))
    assert len(p.propose([5, 2])) == 0  # only "2" matches: one token < min_match
    q = make_proposer("rest")
    q.begin([0], DecodingEnv(vocab_size=10))  # no tokenizer: an empty datastore
    assert len(q.propose([1, 2])) == 0
