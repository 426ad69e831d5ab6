"""local-draft: exactness, cache isolation and catch-up, adaptive sizing, the bridge fit, its own options."""

import json

import pytest
import torch

from splitinfer.cli import main
from splitinfer.client import SplitModel
from splitinfer.decoding.base import make_proposer
from splitinfer.decoding.bridge import RidgeBridge, calibrate, split_meta
from splitinfer.decoding.local_draft import LocalDraft
from splitinfer.errors import SplitInferError
from splitinfer.models import load_model
from tests.splitinfer.decoding.exact import check_same

PROMPTS = ["the cat sat on the mat. the cat sat on the mat. the cat", "def f(x):\n    return x\ndef g(x):", "Hello"]
WITH_DRAFT = "suffix,prompt-lookup,ngram-pool,local-draft"


@pytest.fixture(scope="module")
def sm(tiny):
    return SplitModel(tiny, "2,2", wire_dtype="fp32")


@pytest.fixture(scope="module")
def hollow():
    """The tiny model with a cloud body that computes the identity (attention and MLP outputs zeroed)."""
    loaded = load_model("tiny-random")
    for layer in loaded.model.model.layers[2:-2]:
        torch.nn.init.zeros_(layer.self_attn.o_proj.weight)
        torch.nn.init.zeros_(layer.mlp.down_proj.weight)
    return SplitModel(loaded, "2,2", wire_dtype="fp32")



@pytest.mark.parametrize("name,options", [
    ("local-draft", {}),
    ("local-draft", {"adaptive": False, "draft_budget": 5, "alternatives": 3, "refit_every": 1}),
    ("combined", {"sources": WITH_DRAFT}),
])
def test_token_identical_to_sequential(sm, name, options):
    proposer = make_proposer(name, **options)  # one instance across prompts: the bridge keeps learning
    for prompt in PROMPTS:
        ref = sm.generate(prompt, 40, record_logits=True, stop_on_eos=False)
        res = sm.generate(prompt, 40, record_logits=True, stop_on_eos=False, decoding=proposer)
        check_same(res, ref)


def test_exact_stand_in_drafts_are_always_accepted(hollow):
    """With an identity body the untrained bridge (the identity) is exact: every drafted token is accepted."""
    ref = hollow.generate("Hello there", 41, stop_on_eos=False)
    p = make_proposer("local-draft", adaptive=False, draft_budget=4, alternatives=0, refit_every=0)
    res = hollow.generate("Hello there", 41, stop_on_eos=False, decoding=p)
    assert res.token_ids == ref.token_ids
    assert len(res.steps) == 1 + 8  # prefill, then 5 tokens per step (4 drafted + bonus): 1 + 8 * 5 = 41
    assert all(s.draft_accepted == s.draft_tokens == 4 for s in res.steps[1:])


def test_drafting_never_touches_the_verifier_caches_and_catches_up_exactly(sm):
    seen = {}
    real = sm.forward_step

    def spy(head_cache, tail_cache, *a, **k):
        seen["caches"] = (head_cache, tail_cache)
        return real(head_cache, tail_cache, *a, **k)

    def snapshot():
        return [(dict((i, t.clone()) for i, t in c.keys.items()), c.positions.clone()) for c in seen["caches"]]

    class Watched(LocalDraft):
        def propose(self, context):
            before = snapshot()
            draft = super().propose(context)
            for (keys, pos), (keys2, pos2) in zip(before, snapshot()):
                assert torch.equal(pos, pos2) and all(torch.equal(keys[i], keys2[i]) for i in keys)
            assert self._hc is not seen["caches"][0] and self._tc is not seen["caches"][1]
            assert len(self._tc) == len(context) - 1  # bridged guesses were cropped away
            self.calls = getattr(self, "calls", 0) + 1
            return draft

        def end(self, prompt, output):
            self.final = (self._hc, self._tc)
            super().end(prompt, output)

    p = Watched(adaptive=False, draft_budget=3)
    sm.forward_step = spy
    try:
        res = sm.generate(PROMPTS[0], 30, stop_on_eos=False, decoding=p)
    finally:
        del sm.forward_step
    assert p.calls > 3
    n = len(sm.encode_prompt(PROMPTS[0])) + len(res.token_ids) - 1
    for mine, theirs in zip(p.final, seen["caches"]):  # the drafter's caches hold the committed context exactly
        assert mine.positions.tolist() == theirs.positions.tolist() == list(range(n))
        for layer in theirs.keys:
            assert torch.allclose(mine.keys[layer], theirs.keys[layer], atol=1e-5)
            assert torch.allclose(mine.values[layer], theirs.values[layer], atol=1e-5)


def test_adaptive_chain_shrinks_when_costly_and_grows_when_cheap(hollow):
    def sizes(**cost):
        p = make_proposer("local-draft", draft_budget=6, refit_every=0, **cost)
        hollow.generate("Hello there", 30, stop_on_eos=False, decoding=p)
        return p.sizes

    assert max(sizes(step_ms=20.0, token_ms=5.0, draft_ms=200.0)) == 1  # drafting costs 10 steps: one token only
    assert sum(sizes(step_ms=500.0, token_ms=1.0, draft_ms=1.0)[3:]) > 3 * 5  # accepted and cheap: long chains


def test_ridge_bridge_recovers_a_linear_map(tmp_path):
    gen = torch.Generator().manual_seed(0)
    d, n = 12, 4000
    x = torch.randn(n, d, generator=gen) * torch.linspace(0.1, 10.0, d)  # features of very different scales
    w, b = torch.randn(d, d, generator=gen) * 0.3, torch.randn(d, generator=gen)
    y = x + x @ w + b + 0.001 * torch.randn(n, d, generator=gen)
    bridge = RidgeBridge(d, ridge=1e-3)
    assert torch.equal(bridge(x[:5]), x[:5])  # no pairs yet: the identity (skip the body)
    bridge.observe(x[:2000], y[:2000])
    bridge.observe(x[2000:], y[2000:])  # statistics add up
    bridge.fit()
    assert torch.allclose(bridge.W[:-1], w, atol=1e-3) and torch.allclose(bridge.W[-1], b, atol=1e-2)
    assert (bridge(x) - y).abs().max() < 0.05
    bridge.save(tmp_path / "b", {"split": "2,2"})
    again = RidgeBridge.load(tmp_path / "b.json", {"split": "2,2"})
    assert again.n == n and torch.allclose(again.W, bridge.W)
    with pytest.raises(SplitInferError, match="made for split='2,2', not '1,3'"):
        RidgeBridge.load(tmp_path / "b", {"split": "1,3"})
    with pytest.raises(SplitInferError, match="shrink|samples"):
        RidgeBridge(d, ridge=0.0)


def test_calibration_file_warm_starts_the_bridge(sm, tiny, tmp_path):
    tok = tiny.tokenizer
    seqs = [tok(t, add_special_tokens=False)["input_ids"] for t in ("one two three four five six", "abc " * 20)]
    bridge = calibrate(sm, seqs, progress=False)
    assert bridge.n == sum(map(len, seqs)) and bridge.W is not None
    bridge.save(tmp_path / "cal", split_meta(sm))
    p = make_proposer("local-draft", calibration=str(tmp_path / "cal"), refit_every=0)
    ref = sm.generate(PROMPTS[1], 20, record_logits=True, stop_on_eos=False)
    res = sm.generate(PROMPTS[1], 20, record_logits=True, stop_on_eos=False, decoding=p)
    check_same(res, ref)
    assert p.bridge.n == bridge.n + sum(s.tokens_sent for s in res.steps)  # calibration + every pair of the run
    other = SplitModel(tiny, "1,3", wire_dtype="fp32")
    with pytest.raises(SplitInferError, match="recalibrate"):
        other.generate("x", 3, decoding="local-draft", decoding_options={"calibration": str(tmp_path / "cal")})
    with pytest.raises(SplitInferError, match="no bridge calibration"):
        sm.generate("x", 3, decoding="local-draft", decoding_options={"calibration": str(tmp_path / "none")})


@pytest.mark.parametrize("options,match", [  # the options both model drafters take: test_model_drafter.py
    ({"alternatives": 9}, r"alternatives must be an integer in \[0, draft_budget=8\]"),
    ({"ridge": 0}, "ridge must be a number > 0"),
    ({"refit_every": -1}, "refit_every must be an integer >= 0"),
    ({"draft_ms": -1.0}, "draft_ms must be a number >= 0"),
    ({"calibration": 3}, "calibration must be a file path"),
])
def test_bad_options_are_named(options, match):
    with pytest.raises(SplitInferError, match=match):
        make_proposer("local-draft", **options)


def test_generate_cli(capsys):
    rc = main(["generate", "--model", "tiny-random", "--max-new-tokens", "12", "--decoding", "local-draft",
               "--draft-budget", "3", "--alternatives", "1", "--wire-dtype", "fp32", "--json", "ab ab ab ab"])
    assert rc == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert s["decoding"] == "local-draft" and s["new_tokens"] == 12
    assert main(["generate", "--model", "tiny-random", "--decoding", "local-draft", "--draft-calibration",
                 "/nonexistent/cal", "x"]) == 2
    assert "no bridge calibration" in capsys.readouterr().err


@pytest.mark.real_model
def test_real_model_local_draft_and_combined_with_it_are_exact(real_model_bi):
    """Default model (batch-invariant kernels), split 2,2, fp32 wire, one chat prompt, 32 tokens, logits equal
    bit for bit (about 30 s on 2 cores)."""
    sm = SplitModel(real_model_bi, "2,2", wire_dtype="fp32")
    ids = sm.encode_prompt("Write a Python function that checks whether a number is prime.", chat=True)
    ref = sm.generate(ids, 32, record_logits=True)
    for name, options in (("local-draft", {}), ("combined", {"sources": WITH_DRAFT})):
        p = make_proposer(name, **options)
        res = sm.generate(ids, 32, record_logits=True, decoding=p)
        check_same(res, ref, bitwise=True)
        assert len(res.steps) < len(ref.steps)  # the drafts do get accepted on a real model
