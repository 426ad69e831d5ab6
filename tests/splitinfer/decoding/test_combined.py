from splitinfer.decoding.base import DecodingEnv, StepFeedback
from splitinfer.decoding.combined import AcceptanceStats, Combined


def test_stats_start_at_the_prior_and_follow_observations():
    s = AcceptanceStats(decay=1.0, prior_strength=2.0)
    assert abs(s.estimate("a", 0.5, 1) - 0.5) < 1e-9
    key = s.key("a", 0.5, 1)
    s.observe([(key, False)] * 8)
    assert s.estimate("a", 0.5, 1) < 0.15
    assert abs(s.estimate("b", 0.5, 1) - 0.5) < 1e-9  # other sources untouched


def test_tree_shrinks_when_drafts_keep_failing():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8] * 4
    p = Combined(draft_budget=16, step_ms=100.0, token_ms=10.0, sources="prompt-lookup,ngram-pool")
    p.begin(prompt, DecodingEnv(vocab_size=50))
    context = prompt + [1]
    sizes = []
    for _ in range(30):
        d = p.propose(context)
        sizes.append(len(d))
        # the model never agrees: nothing accepted, bonus token 49 (unseen)
        p.update(context, [49], StepFeedback(d, [0] * len(d), [], 49, None, list(range(len(d)))))
        context = prompt + [1]  # same situation again
    assert sizes[0] > 4 and sizes[-1] == 0


def test_tree_stays_large_when_drafts_succeed():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8] * 4
    p = Combined(draft_budget=8, step_ms=100.0, token_ms=2.0, sources="prompt-lookup")
    p.begin(prompt, DecodingEnv(vocab_size=50))
    context = prompt + [1]
    for _ in range(10):
        d = p.propose(context)
        assert d.parents == tuple(range(-1, len(d) - 1))  # one continuation: a chain
        p.update(context, [], StepFeedback(d, [0] * len(d), list(range(len(d))), 2, None, list(range(len(d)))))
    assert p.propose(context).tokens == (2, 3, 4, 5, 6, 7, 8, 1)  # the whole budget
