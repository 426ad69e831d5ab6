from splitinfer.decoding.base import DecodingEnv
from splitinfer.decoding.ngram_pool import NgramPool, add_ngram, build_pool

ENV = DecodingEnv(vocab_size=100)


def test_build_pool_keys_by_first_token_in_order_without_duplicates():
    pool = build_pool([1, 2, 3, 1, 2, 4, 1, 2, 3], n=3)
    assert pool[1] == [(2, 3), (2, 4)]
    assert pool[2] == [(3, 1), (4, 1)]
    add_ngram(pool, 1, (2, 3))
    assert pool[1] == [(2, 3), (2, 4)]


def test_proposes_the_oldest_g_candidates_as_separate_branches():
    p = NgramPool(ngram=3, pool=2)
    p.begin([1, 2, 3, 1, 2, 4, 1, 5, 6], ENV)
    d = p.propose([9, 1])
    assert d.tokens == (2, 3, 2, 4) and d.parents == (-1, 0, -1, 2)  # seed: no prefix merging, oldest first
    assert len(p.propose([9, 77])) == 0


def test_update_adds_only_the_newest_ngram_like_the_seed():
    p = NgramPool(ngram=3, pool=5)
    p.begin([1, 2], ENV)
    p.update([1, 2], [3, 4, 5])  # context becomes 1 2 3 4 5: only (3 -> 4 5) is added
    assert p.pool == {3: [(4, 5)]}
