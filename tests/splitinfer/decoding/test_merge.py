from splitinfer.decoding.base import Candidate
from splitinfer.decoding.merge import best_size, chains_to_draft, merge_candidates, ranked_nodes, select


def cand(tokens, conf, source="s", rank=0):
    return Candidate(tuple(tokens), tuple(conf), source, rank)


def test_merge_dedupes_prefixes_and_scores_paths():
    tree = merge_candidates([cand([1, 2, 3], [0.5, 0.5, 0.5]), cand([1, 2, 4], [0.9, 0.9, 0.1]), cand([5], [0.2])])
    assert tree.tokens == [1, 2, 3, 4, 5]
    assert tree.parents == [-1, 0, 1, 1, -1]
    assert tree.scores[0] == 0.9 and abs(tree.scores[1] - 0.81) < 1e-12  # max over candidates
    assert abs(tree.scores[2] - 0.125) < 1e-12 and abs(tree.scores[3] - 0.081) < 1e-12
    assert len(tree.origins[0]) == 2


def test_select_best_nodes_is_prefix_closed_and_topological():
    tree = merge_candidates([cand([1, 2, 3], [0.9, 0.9, 0.9]), cand([7, 8], [0.95, 0.1])])
    order = ranked_nodes(tree)
    assert order[0] == 3  # token 7 (0.95) first
    draft, keep = select(tree, 3)
    assert draft.tokens == (1, 2, 7) and draft.parents == (-1, 0, -1) and keep == [0, 1, 3]


def test_best_size_trades_gain_against_cost():
    scores = [0.9, 0.8, 0.1, 0.01]
    assert best_size(scores, 10, fixed_ms=100.0, per_token_ms=0.0) == 4  # free tokens: send everything
    assert best_size(scores, 2, fixed_ms=100.0, per_token_ms=0.0) == 2  # budget caps
    assert best_size(scores, 10, fixed_ms=100.0, per_token_ms=50.0) == 2  # 0.1 does not pay for 50 ms
    assert best_size(scores, 10, fixed_ms=1.0, per_token_ms=100.0) == 0
    assert best_size([], 10, 1.0, 1.0) == 0


def test_chains_to_draft_separate_branches_or_trie():
    assert chains_to_draft([[1, 2], [1, 3]], dedupe=False).parents == (-1, 0, -1, 2)
    d = chains_to_draft([[1, 2], [1, 3]])
    assert d.tokens == (1, 2, 3) and d.parents == (-1, 0, 0)
