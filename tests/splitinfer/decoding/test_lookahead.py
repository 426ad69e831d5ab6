from splitinfer.decoding.base import DecodingEnv, StepFeedback
from splitinfer.decoding.lookahead import Lookahead, lookahead_tree


def test_window_is_a_level0_chain_with_diagonals():
    levels = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]  # N-1 = 3 levels, W = 3
    tokens, parents, diags = lookahead_tree(levels, offset=2)
    assert tokens == [1, 2, 3, 4, 7, 5, 8, 6, 9]
    assert parents == [-1, 2, 3, 2, 5, 3, 7, 4, 9]
    assert diags == [[2, 5, 6], [3, 7, 8], [4, 9, 10]]


def test_step_feeds_the_pool_and_advances_the_window():
    p = Lookahead(window=2, ngram=3, pool=2)
    p.begin([5, 5, 5], DecodingEnv(vocab_size=10))
    p.levels = [[1, 2], [3, 4]]
    d = p.propose([0, 9])  # empty pool: the draft is the lookahead branch alone
    assert d.tokens == (1, 2, 3, 4) and d.parents == (-1, 0, 0, 1)
    argmax = [0, 0, 7, 8]  # outputs on top of the diagonals (nodes 2 and 3)
    p.update([0, 9], [6], StepFeedback(d, argmax, [], 6, None, [0, 1, 2, 3]))
    assert p.levels == [[3, 4], [7, 8]]
    assert list(p.pool[1]) == [(3, 7)] and list(p.pool[2]) == [(4, 8)]
    cand = p.propose([0, 1])
    assert cand.tokens[:2] == (3, 7) and cand.parents[:2] == (-1, 0)


def test_pool_is_lru_with_g_entries_per_key():
    p = Lookahead(window=1, ngram=2, pool=2)
    p.begin([1], DecodingEnv(vocab_size=10))
    for ngram in [(1, 2), (1, 3), (1, 2), (1, 4)]:
        p._add(ngram)
    assert list(p.pool[1]) == [(2,), (4,)]
