import numpy as np
import pytest

from splitinfer.decoding.datastore import SEP, Datastore, corpus_datastore, count_tree
from splitinfer.errors import SplitInferError


def brute_longest(docs, context, max_match):
    """The longest context suffix (<= max_match) occurring in a document with a token after it, and its starts."""
    flat = [t for d in docs for t in [*d, SEP]]
    for m in range(min(max_match, len(context)), 0, -1):
        pat = list(context[-m:])
        starts = [i for i in range(len(flat) - m) if flat[i : i + m] == pat and flat[i + m] != SEP]
        if starts:
            return m, sorted(starts)
    return 0, []


def test_longest_match_agrees_with_brute_force_on_random_documents():
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 4, size=rng.integers(1, 30)).tolist() for _ in range(12)]
    store = Datastore(docs, width=6)
    for _ in range(200):
        ctx = rng.integers(0, 4, size=rng.integers(1, 9)).tolist()
        m, starts = store.longest_match(ctx, 5)
        assert (m, sorted(starts.tolist())) == brute_longest(docs, ctx, 5)


def test_matches_never_cross_documents_and_continuations_stop_at_their_end():
    store = Datastore([[1, 2], [3, 4, 5]], width=4)
    assert store.longest_match([9, 2], 3)[0] == 0  # 2 ends its document: nothing follows it
    m, starts = store.longest_match([7, 3], 3)
    assert m == 1 and store.continuations(starts, m, depth=5, max_samples=4) == [[4, 5]]
    assert store.longest_match([2, 3], 3)[0] == 1  # "2 3" spans two documents: only "3" matches


def test_count_tree_ranks_nodes_by_path_frequency_parents_first():
    tree = count_tree([[3, 4], [3, 5], [3, 4], [7]], budget=3)
    assert [(t, p) for t, p, _, _ in tree] == [(3, -1), (4, 0), (7, -1)]
    assert tree[0][2] == pytest.approx(0.75) and tree[1][3] == pytest.approx(2 / 3)
    assert count_tree([[1]], budget=0) == [] and count_tree([[1, 2]], budget=5, min_prob=1.0) == [(1, -1, 1.0, 1.0),
                                                                                                     (2, 0, 1.0, 1.0)]


def test_empty_datastore_without_a_tokenizer_and_bad_width():
    assert len(corpus_datastore(None, "chat", 1000)) == 0
    assert Datastore([]).longest_match([1, 2], 4)[0] == 0
    with pytest.raises(SplitInferError, match="width"):
        Datastore([[1]], width=1)
