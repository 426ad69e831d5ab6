from splitinfer.decoding.prompt_lookup import PromptLookup, find_continuations


def test_longest_suffix_match_most_recent_first():
    ctx = [1, 2, 3, 9, 1, 2, 3, 8, 7, 1, 2, 3]
    n, conts = find_continuations(ctx, max_ngram=3, k=2, max_candidates=2)
    assert n == 3 and conts == [[8, 7], [9, 1]]


def test_falls_back_to_shorter_matches_and_nothing():
    assert find_continuations([5, 6, 7, 4, 6, 7], 3, 3) == (2, [[4, 6, 7]])
    assert find_continuations([1, 2, 3], 3, 3) == (0, [])
    assert find_continuations([4], 3, 3) == (0, [])


def test_continuation_is_cut_at_k_and_at_the_end():
    assert find_continuations([1, 2, 1], 3, 5) == (1, [[2, 1]])
    p = PromptLookup(ngram=3, draft_budget=2)
    d = p.propose([1, 2, 3, 4, 1, 2])
    assert d.tokens == (3, 4) and d.parents == (-1, 0)


def test_several_candidates_merge_into_a_tree_within_budget():
    p = PromptLookup(ngram=1, draft_budget=3, candidates=3)
    d = p.propose([7, 1, 7, 2, 3, 7])
    assert d.tokens == (2, 3, 7)  # the most recent continuation outranks [1, 7, 2]


def test_first_occurrence_and_eos_cut_follow_transformers():
    from splitinfer.decoding.base import DecodingEnv

    ctx = [1, 2, 3, 9, 1, 2, 3, 8, 7, 1, 2, 3]
    assert find_continuations(ctx, 3, 2, first=True) == (3, [[9, 1]])
    p = PromptLookup(ngram=2, draft_budget=10, occurrence="first")
    p.begin([5], DecodingEnv(vocab_size=20, eos_ids=frozenset({9})))
    assert p.propose(ctx).tokens == ()  # the earliest continuation starts with EOS: no guess, as in transformers
    assert p.propose([4, 5, 6, 0, 4, 5]).tokens == (6, 0, 4, 5)
