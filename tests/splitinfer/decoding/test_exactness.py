"""Every proposer must leave the output exactly as sequential decoding makes it.

Fast checks on the tiny random model (token identity and logits within 1e-4
on an fp32 wire, EOS inside an accepted draft, the token budget cutting a
draft, consistent caches afterwards, the sampling distribution), and one
real-model check (``-m real_model``). The full 20-prompt x 200-token check
is ``splitinfer bench decoding``.
"""

import pytest
import torch
from scipy.stats import chisquare

from splitinfer.client import SplitModel
from splitinfer.decoding.base import Draft, Proposer, list_proposers, make_proposer
from splitinfer.decoding.feature_head import default_dir, head_files
from splitinfer.decoding.verify import sampling_probs
from tests.splitinfer.decoding.exact import check_same

PROMPTS = [
    "the cat sat on the mat. the cat sat on the mat. the cat",
    "def f(x):\n    return x\ndef g(x):\n    return",
    '{"a": 1, "b": 2, "a": 1, "b"',
    "Hello",
]
FAST_OPTIONS = {"jacobi": {"block": 6}, "lookahead": {"window": 3, "ngram": 4, "pool": 3},
                "rest": {"corpora": "chat", "max_tokens": 20000, "min_prob": 0.0},
                "suffix-automaton": {"corpora": "chat", "max_tokens": 20000}}


@pytest.fixture(scope="module")
def sm(tiny):
    return SplitModel(tiny, "2,2", wire_dtype="fp32")



@pytest.mark.parametrize("name", list_proposers())
def test_every_proposer_is_token_identical_to_sequential(sm, name, feature_head_dir):
    options = {**FAST_OPTIONS.get(name, {}), **({"draft_head": str(feature_head_dir)} if name == "feature-draft" else {})}
    for prompt in PROMPTS:
        ref = sm.generate(prompt, 40, record_logits=True, stop_on_eos=False)
        res = sm.generate(prompt, 40, record_logits=True, stop_on_eos=False, decoding=name,
                          decoding_options=options)
        check_same(res, ref)
        assert len(res.steps) <= len(ref.steps)


class Oracle(Proposer):
    """Drafts the known greedy continuation (k tokens), with a wrong sibling at every depth."""

    def __init__(self, full, prompt_len, k, decoys=True, vocab=259):
        self.full, self.p, self.k, self.decoys, self.vocab = full, prompt_len, k, decoys, vocab

    def propose(self, context):
        chain = self.full[len(context) - self.p : len(context) - self.p + self.k]
        tokens, parents, last = [], [], -1
        for t in chain:
            if self.decoys:
                tokens.append((t + 1) % self.vocab)
                parents.append(last)
            tokens.append(t)
            parents.append(last)
            last = len(tokens) - 1
        return Draft(tuple(tokens), tuple(parents))


def test_oracle_tree_commits_many_tokens_per_step_exactly(sm):
    ids = sm.encode_prompt(PROMPTS[3])
    ref = sm.generate(ids, 30, record_logits=True, stop_on_eos=False)
    res = sm.generate(ids, 30, record_logits=True, stop_on_eos=False, decoding=Oracle(ref.token_ids, len(ids), 5))
    check_same(res, ref)
    assert len(res.steps) == 1 + 5  # prefill, then 6 tokens per step (5 drafted + bonus); 1 + 5 * 6 = 31 >= 30
    s = res.summary()
    assert s["draft_acceptance_rate"] == pytest.approx(sum(t.draft_accepted for t in res.steps) / sum(
        t.draft_tokens for t in res.steps))
    assert s["tokens_sent_per_step"] > 5 and s["modelled_tok_s"] > 0 and s["bytes_per_step"] > 0


@pytest.mark.parametrize("budget", [2, 7, 13, 14])
def test_token_budget_cuts_a_draft_exactly(sm, budget):
    ids = sm.encode_prompt(PROMPTS[0])
    full = sm.generate(ids, 40, stop_on_eos=False).token_ids
    ref = sm.generate(ids, budget, record_logits=True, stop_on_eos=False)
    res = sm.generate(ids, budget, record_logits=True, stop_on_eos=False, decoding=Oracle(full, len(ids), 8))
    check_same(res, ref)
    assert len(res.token_ids) == budget


@pytest.mark.parametrize("eos_at", [1, 4, 9])
def test_eos_inside_an_accepted_draft_stops_exactly(sm, tiny, monkeypatch, eos_at):
    ids = sm.encode_prompt(PROMPTS[1])
    full = sm.generate(ids, 40, stop_on_eos=False).token_ids
    monkeypatch.setattr(tiny.model.generation_config, "eos_token_id", full[eos_at])
    ref = sm.generate(ids, 40, record_logits=True)
    assert ref.token_ids[-1] == full[eos_at] and len(ref.token_ids) <= eos_at + 1
    res = sm.generate(ids, 40, record_logits=True, decoding=Oracle(full, len(ids), 12))
    check_same(res, ref)


def test_caches_hold_exactly_the_committed_context_afterwards(sm):
    caches = []
    real = sm.forward_step

    def spy(head_cache, tail_cache, *a, **k):
        caches[:] = [head_cache, tail_cache]
        return real(head_cache, tail_cache, *a, **k)

    sm.forward_step = spy
    try:
        ids = sm.encode_prompt(PROMPTS[0])
        res = sm.generate(ids, 25, stop_on_eos=False, decoding="combined")
    finally:
        del sm.forward_step
    for cache in caches:  # everything but the last emitted token, which was never fed back
        assert cache.positions.tolist() == list(range(len(ids) + 24))
    assert len(res.token_ids) == 25


@pytest.mark.slow  # `make test-all` (not in CI: the 20-minute budget)
def test_sampling_keeps_the_distribution_of_drafted_positions(sm, tiny):
    """Chi-square over 800 seeds: the token chosen by speculative sampling at a drafted position
    (step 2, with three deterministic guesses) follows the model's exact marginal distribution."""
    temp, top_p = 0.7, 0.95
    ids = sm.encode_prompt("Hello world")
    model = tiny.model
    with torch.no_grad():
        logits1 = model(torch.tensor([ids])).logits[0, -1]  # (V,)
        batch = torch.tensor([ids + [t] for t in range(logits1.numel())])  # (V, P+1)
        logits2 = model(batch).logits[:, -1]  # (V, V): next-token logits after each first token
    p1 = sampling_probs(logits1, temp, top_p)
    p2 = torch.stack([sampling_probs(row, temp, top_p) for row in logits2])  # (V, V)
    marginal = (p1[:, None] * p2).sum(0)  # exact P(second token)

    class TopGuesses(Proposer):
        def propose(self, context):
            first = context[-1]
            top = torch.argsort(p2[first], descending=True)[:2].tolist()
            return Draft((top[0], top[1], 3), (-1, -1, -1))

    n, counts = 800, torch.zeros_like(marginal)
    for seed in range(n):
        out = sm.generate(ids, 3, temperature=temp, top_p=top_p, seed=seed, stop_on_eos=False,
                          decoding=TopGuesses()).token_ids
        counts[out[1]] += 1
    expected = marginal * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    assert chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue > 1e-3


@pytest.mark.real_model
def test_real_model_every_proposer_is_exact(real_model_bi):
    """Default model with batch-invariant kernels, one chat prompt, 32 tokens, fp32 wire: every proposer
    token-identical and logits equal bit for bit (local-draft on the real model: test_local_draft.py). The tiny
    model runs every proposer on more prompts; this test is about the real model's float32 floor (with the
    default kernels it once asserted 1e-4 and failed on a machine whose floor is 2.3e-4)."""
    sm = SplitModel(real_model_bi, "2,2", wire_dtype="fp32")
    trained = head_files(default_dir(real_model_bi.sha256))[1].exists()  # written by `splitinfer draft-train`
    skip = {"sequential", "local-draft"} | (set() if trained else {"feature-draft"})
    ids = sm.encode_prompt("Write a Python function that returns the n-th Fibonacci number.", chat=True)
    ref = sm.generate(ids, 32, record_logits=True)
    for name in sorted(set(list_proposers()) - skip):
        res = sm.generate(ids, 32, record_logits=True, decoding=make_proposer(name, **FAST_OPTIONS.get(name, {})))
        check_same(res, ref, bitwise=True)


def test_feedback_never_reports_accepted_guesses_past_eos(sm, tiny, monkeypatch):
    """The model keeps agreeing with the oracle after EOS; proposers must only learn what was emitted."""
    ids = sm.encode_prompt(PROMPTS[1])
    full = sm.generate(ids, 40, stop_on_eos=False).token_ids
    monkeypatch.setattr(tiny.model.generation_config, "eos_token_id", full[6])

    class Spy(Oracle):
        def update(self, context, accepted, feedback=None):
            if feedback is not None and len(feedback.draft):
                self.last = (list(accepted), [feedback.draft.tokens[i] for i in feedback.accepted_nodes])

    spy = Spy(full, len(ids), 12, decoys=False)
    res = sm.generate(ids, 40, decoding=spy)
    emitted, learned = spy.last
    assert res.token_ids[-1] == full[6] == emitted[-1]
    assert learned == emitted  # EOS was a drafted guess: it and the guesses before it, none of the later ones
