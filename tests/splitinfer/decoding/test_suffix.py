from splitinfer.decoding.base import DecodingEnv
from splitinfer.decoding.suffix import Suffix, SuffixTrie, tree_to_candidates


def test_trie_counts_all_substrings_up_to_max_depth():
    t = SuffixTrie(max_depth=3)
    t.add_document([1, 2, 1, 2, 3])
    assert t.count[t.walk([1, 2])] == 2
    assert t.count[t.walk([2])] == 2 and t.count[t.walk([1, 2, 3])] == 1
    assert t.walk([1, 2, 1, 2]) is None  # deeper than max_depth
    assert t.walk([3, 1]) is None


def test_match_needs_an_earlier_occurrence_with_a_continuation():
    t = SuffixTrie(max_depth=8)
    t.add_document([5, 6, 7, 8, 5, 6, 7])
    node, n = t.match([0, 5, 6, 7], max_match=4)
    assert n == 3 and t.token[node] == 7
    assert t.match([9], 4) == (0, 0)


def test_speculate_best_first_by_path_probability():
    t = SuffixTrie(max_depth=8)
    t.add_document([1, 2, 3, 1, 2, 3, 1, 2, 4])
    node, n = t.match([1, 2], 2)
    tree = t.speculate(node, budget=4, min_prob=0.0)
    # 3 (2/3), then 1 after it (2/3 * 1), then 2 (2/3 * 1), then 4 (1/3) ties with 3 or 4 after 1 2 3 1 2
    assert [x[0] for x in tree][:3] == [3, 1, 2] and tree[3][2] == 1 / 3
    assert tree[1][1] == 0 and tree[2][1] == 1 and abs(tree[2][2] - 2 / 3) < 1e-9
    assert [x[0] for x in t.speculate(node, budget=5, min_prob=0.5)] == [3, 1, 2]


def test_tree_to_candidates_lists_leaf_paths_best_first():
    tree = [(3, -1, 0.6, 0.6), (1, 0, 0.6, 1.0), (4, -1, 0.3, 0.3)]
    cands = tree_to_candidates(tree, "suffix")
    assert [c.tokens for c in cands] == [(3, 1), (4,)] and cands[0].conf == (0.6, 1.0)


def test_history_of_previous_outputs_is_used_and_kept_across_requests():
    p = Suffix(alpha=8.0, min_prob=0.0)
    env = DecodingEnv(vocab_size=50)
    p.begin([40, 41], env)
    p.end([40, 41], [10, 11, 12, 13, 14])
    p.begin([42, 10, 11], env)  # new request: its prompt ends with the start of an old output
    d = p.propose([42, 10, 11])
    assert d.tokens[:3] == (12, 13, 14)
    p.update([42, 10, 11], [12])
    assert p.local_trie.walk([11, 12]) is not None
