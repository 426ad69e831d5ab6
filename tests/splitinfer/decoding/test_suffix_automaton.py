import numpy as np

from splitinfer.decoding.base import DecodingEnv, make_proposer
from splitinfer.decoding.suffix_automaton import SuffixAutomaton


def brute(text, k):
    """Longest suffix of ``text`` occurring earlier with a continuation; the tokens after its first occurrence."""
    n = len(text)
    for m in range(n - 1, 0, -1):
        suf = text[n - m :]
        for end in range(m, n):  # occurrence text[end - m : end], continuation text[end]
            if text[end - m : end] == suf:
                return m, text[end : end + k]
    return 0, []


def test_automaton_match_agrees_with_brute_force():
    rng = np.random.default_rng(1)
    for _ in range(60):
        text = rng.integers(0, 3, size=rng.integers(2, 40)).tolist()
        sam = SuffixAutomaton()
        for t in text:
            sam.extend(t)
        link = sam.link[sam.last]
        assert sam.continuation(link, sam.length[link], 4) == brute(text, 4)


def test_matching_state_follows_a_growing_context_over_another_text():
    sam = SuffixAutomaton()
    for t in [5, 6, 7, 8, -1, 6, 7, 9]:
        sam.extend(t)
    state = (0, 0)
    for t in [1, 6, 7]:
        state = sam.step(*state, t)
    assert state[1] == 2 and sam.continuation(*state, 3) == (2, [8])  # first occurrence of "6 7": then 8, then -1


def test_proposer_uses_request_then_history_and_is_registered():
    p = make_proposer("suffix-automaton", corpora="")
    env = DecodingEnv(vocab_size=50)
    p.begin([1, 2, 3, 4, 1, 2], env)
    assert p.propose([1, 2, 3, 4, 1, 2]).tokens == (3, 4, 1, 2)
    p.update([1, 2, 3, 4, 1, 2], [3])
    p.end([1, 2], [10, 11, 12, 13])
    p.begin([20, 10, 11], env)  # the new prompt ends with the start of an earlier output
    assert p.propose([20, 10, 11]).tokens == (12, 13)
    assert [c.source for c in p.candidates([20, 10, 11])] == ["suffix-automaton-history"]
