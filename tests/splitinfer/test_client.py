import pytest
import torch

from splitinfer.client import SplitModel
from splitinfer.errors import SplitInferError
from splitinfer.link import WanProfile
from splitinfer.session import ServiceLimits

PROMPTS = ["Once upon a time", "def add(a, b):", '{"name": "Ada", "age":', "Q: What is 2+2?\nA:"]


def reference(loaded, prompt_ids, n):
    """Greedy tokens and per-step logits of the unsplit model via HF generate."""
    ids = torch.tensor([prompt_ids])
    out = loaded.model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
        output_logits=True, return_dict_in_generate=True, pad_token_id=loaded.tokenizer.pad_token_id,
    )
    return out.sequences[0, len(prompt_ids):].tolist(), torch.stack([l[0] for l in out.logits])


@pytest.mark.parametrize("split", ["1,1", "2,2", "1,4", "4,1"])
def test_greedy_split_generation_is_exact(tiny, split):
    sm = SplitModel(tiny, split, wire_dtype="fp32")
    for prompt in PROMPTS:
        ids = sm.encode_prompt(prompt)
        ref_ids, ref_logits = reference(tiny, ids, 24)
        res = sm.generate(ids, 24, record_logits=True)
        assert res.token_ids == ref_ids
        assert (torch.stack(res.logits) - ref_logits).abs().max() <= 1e-4


def test_fp16_wire_is_close(tiny):
    sm = SplitModel(tiny, "2,2", wire_dtype="fp16")
    ids = sm.encode_prompt(PROMPTS[0])
    ref_ids, ref_logits = reference(tiny, ids, 16)
    res = sm.generate(ids, 16, record_logits=True)
    diff = (torch.stack(res.logits)[: len(ref_ids)] - ref_logits[: len(res.logits)]).abs().max()
    assert diff < 0.5  # fp16 rounding of the hidden states; reported, not exact


def test_summary_fields_and_streaming(tiny):
    sm = SplitModel(tiny, "2,2", wan=WanProfile(rtt_ms=1, bandwidth_mbps=100))
    pieces = []
    res = sm.generate("Hello", 12, stop_on_eos=False, on_text=pieces.append)
    s = res.summary()
    for key in ("text", "token_ids", "steps", "tokens_per_step", "tok_s", "bytes_sent", "bytes_received", "breakdown_ms"):
        assert key in s
    assert s["steps"] == 12 and s["tokens_per_step"] == 1.0 and len(s["token_ids"]) == 12
    assert s["bytes_sent"] > 0 and s["bytes_received"] > 0
    assert set(s["breakdown_ms"]) >= {"head_ms", "body_ms", "tail_ms", "codec_ms", "network_ms", "total_ms"}
    assert s["breakdown_ms"]["network_ms"] >= 1.0  # the emulated RTT shows up as network time
    assert "".join(pieces) == res.text


def test_sampling_is_seeded(tiny):
    sm = SplitModel(tiny, "2,2")
    a = sm.generate("Hi", 20, temperature=1.0, top_p=0.9, seed=3, stop_on_eos=False).token_ids
    b = sm.generate("Hi", 20, temperature=1.0, top_p=0.9, seed=3, stop_on_eos=False).token_ids
    c = sm.generate("Hi", 20, temperature=1.0, top_p=0.9, seed=4, stop_on_eos=False).token_ids
    assert a == b and a != c


def test_stops_on_eos(tiny):
    sm = SplitModel(tiny, "2,2")
    eos = tiny.tokenizer.eos_token_id
    # force EOS: make the LM head favour it strongly, on a private copy of the model
    import copy

    from splitinfer.models import LoadedModel

    model = copy.deepcopy(tiny.model)
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.clone())
        model.lm_head.weight[eos] = 0
        model.lm_head.bias = None
    loaded = LoadedModel(model, tiny.tokenizer, "tiny-eos", "x", None)
    sm = SplitModel(loaded, "2,2")
    with torch.no_grad():
        model.lm_head.weight[eos] = 50 * model.lm_head.weight.abs().max() * torch.sign(
            torch.randn(model.config.hidden_size)
        )
    res = sm.generate("Hello world", 50)
    assert len(res.token_ids) < 50 and res.token_ids[-1] == eos


def test_chat_template(tiny):
    sm = SplitModel(tiny, "2,2")
    ids = sm.encode_prompt("hi", chat=True)
    text = tiny.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>user\nhi<|im_end|>") and text.endswith("<|im_start|>assistant\n")


def test_bad_requests_give_clear_errors(tiny):
    sm = SplitModel(tiny, "2,2")
    with pytest.raises(SplitInferError, match="context limit of 1024"):
        sm.generate("x" * 1000, 100)
    with pytest.raises(SplitInferError, match="prompt is empty"):
        sm.generate("", 4)
    with pytest.raises(SplitInferError, match="max_new_tokens"):
        sm.generate("hi", 0)
    with pytest.raises(SplitInferError, match="temperature"):
        sm.generate("hi", 4, temperature=-1)
    with pytest.raises(SplitInferError, match="bad split"):
        SplitModel(tiny, "3,3")


def test_cloud_max_context_is_enforced(tiny):
    sm = SplitModel(tiny, "2,2", service_limits=ServiceLimits(max_context=8))
    with pytest.raises(SplitInferError, match="max-context 8"):
        sm.generate("0123456789", 4)
    # the session was closed; a fitting request still works
    assert len(sm.generate("abc", 4, stop_on_eos=False).token_ids) == 4


def test_local_param_bytes_counts_tied_embedding_once(tiny):
    """Regression: the tied embedding / LM head was counted twice (once in the head, once in the tail)."""
    from splitinfer.partition import param_bytes

    sm = SplitModel(tiny, "2,2")
    base = tiny.model.model
    parts = [base.embed_tokens, base.norm, base.rotary_emb, *base.layers[:2], *base.layers[-2:]]
    expected = sum(param_bytes(m) for m in parts)
    assert tiny.model.config.tie_word_embeddings
    assert sm.local_param_bytes() == expected


def test_noise_leaves_the_public_opening_untouched_in_the_runtime(tiny):
    """The runtime passes its public opening to the defenses that spare it: the BOS and template states (no
    user text in them) reach the body as they are, so their logits are the undefended ones exactly. Before,
    the client passed no mask and the clip crushed the attention sink (Gemma: 37.5% next-token agreement
    under the clip alone instead of 97.9%)."""
    from splitinfer.tokens import encode_chat, public_prefix_length

    ids = encode_chat(tiny.tokenizer, [{"role": "user", "content": "a private question"}]).ids
    n = public_prefix_length(tiny.tokenizer, ids)
    assert n == 6
    plain = SplitModel(tiny, "2,2", wire_dtype="fp32").sequence_logits(ids)
    noised = SplitModel(tiny, "2,2", wire_dtype="fp32", defense="noise(sigma=1.0,clip=0.5)").sequence_logits(ids)
    assert torch.equal(noised[:n], plain[:n])
    assert not torch.allclose(noised[n:], plain[n:])


def test_only_a_step_from_the_sequence_start_has_public_rows(tiny):
    from splitinfer.tokens import public_opening

    sm = SplitModel(tiny, "2,2")
    opening = public_opening(tiny.tokenizer)
    assert sm._public_rows(opening + [70], list(range(7)), None) == [True] * 6 + [False]
    assert sm._public_rows(opening, list(range(3, 9)), None) is None  # a later step: every row is user data
    assert sm._public_rows(opening, list(range(6)), [-1, 0, 1, 2, 3, 4]) is None  # a draft tree
    assert sm._public_rows([70] + opening, list(range(7)), None) is None
