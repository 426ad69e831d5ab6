import pytest
import torch
from scipy.stats import chisquare

from splitinfer.decoding.base import Draft
from splitinfer.decoding.verify import greedy_accept, prune_draft, sampling_probs, speculative_accept


def test_greedy_accept_takes_the_longest_consistent_path():
    # root 0 (token 10); children 1 (11, right), 2 (12, wrong); 1 -> 3 (13, right) -> 4 (99, wrong); 1 -> 5 (14)
    tokens = [10, 11, 12, 13, 99, 14]
    parents = [-1, 0, 0, 1, 3, 1]
    argmax = [11, 13, 0, 20, 0, 0]  # greedy token after each node
    path, emitted = greedy_accept(tokens, parents, argmax)
    assert path == [0, 1, 3] and emitted == [11, 13, 20]


def test_greedy_accept_with_nothing_right_emits_the_bonus_only():
    path, emitted = greedy_accept([10, 7, 8], [-1, 0, 1], [5, 1, 2])
    assert path == [0] and emitted == [5]
    path, emitted = greedy_accept([10], [-1], [5])
    assert path == [0] and emitted == [5]


def test_greedy_accept_duplicate_siblings_pick_the_deeper_branch():
    tokens = [1, 2, 2, 3]
    parents = [-1, 0, 0, 2]
    path, emitted = greedy_accept(tokens, parents, [2, 9, 3, 4])
    assert path == [0, 2, 3] and emitted == [2, 3, 4]


def test_prune_draft_by_depth_and_count_keeps_a_valid_tree():
    d = Draft((1, 2, 3, 4, 5), (-1, 0, 1, -1, 3))
    pruned, kept = prune_draft(d, max_depth=2, max_nodes=10)
    assert kept == [0, 1, 3, 4] and pruned.parents == (-1, 0, -1, 2)
    pruned, kept = prune_draft(d, max_depth=5, max_nodes=2)
    assert kept == [0, 1]
    assert prune_draft(d, max_depth=0, max_nodes=5)[1] == []


def test_sampling_probs_temperature_and_top_p():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    p = sampling_probs(logits, 1.0, 1.0)
    assert torch.allclose(p, torch.softmax(logits, -1))
    q = sampling_probs(logits, 1.0, 0.7)
    assert q[2] == 0 and q[3] == 0 and q[0] > 0 and q[1] > 0  # 0.64 < 0.7 so the second token stays


@pytest.mark.parametrize("children", [[0], [0, 1, 2], [3, 1]])
def test_speculative_accept_keeps_the_target_distribution(children):
    """Chi-square: the first emitted token follows p whatever the (deterministic) guesses are."""
    p = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05])
    tokens = [99] + children
    parents = [-1] + [0] * len(children)
    gen = torch.Generator().manual_seed(1234)
    n = 6000
    counts = torch.zeros(5)
    for _ in range(n):
        _, out = speculative_accept(tokens, parents, lambda i: p, gen)
        counts[out[0]] += 1
    assert chisquare(counts.numpy(), (p * n).numpy()).pvalue > 1e-3


def test_speculative_accept_walks_down_accepted_guesses():
    peaked = torch.tensor([0.0, 1.0, 0.0])  # always token 1
    gen = torch.Generator().manual_seed(0)
    path, out = speculative_accept([0, 1, 1, 2], [-1, 0, 1, 2], lambda i: peaked, gen)
    assert path == [0, 1, 2] and out == [1, 1, 1]  # node 3 (token 2) rejected; bonus sampled = 1
