"""Every tested decoder family, as a tiny random model built in code: the split runtime is exact on it.

For each family of :data:`splitinfer.families.TESTED` (4 layers, d=64, the 262-token byte tokenizer,
windows of 4 tokens so that sliding layers matter): split generation equals transformers' own greedy
``generate`` on an untouched copy of the model (tokens identical, logits within 1e-4) for sequential
decoding and for a token-tree draft with rejected siblings (KV commit of a non-contiguous path); a
tree step, a commit and a crop leave the caches as a plain chain leaves them; taps equal the model's
own hidden states; white-box vocabulary matching (its proposer fitted on the taps) recovers every token; the lora-random defense
reaches the family's head layers and stays exact against the unsplit model with those layers. Then
the refusals: families the runtime cannot split are refused at load in one line.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from attacks.registry import make_attack
from attacks.taps import extract_depths
from splitinfer import families
from splitinfer.client import SplitModel
from splitinfer.defenses.lora_random import with_head_layers
from splitinfer.errors import SplitInferError
from splitinfer.kv_cache import PartKVCache
from splitinfer.models import LoadedModel, load_model, tiny_tokenizer, weights_sha256
from splitinfer.partition import LocalHead, SplitConfig, split_model
from splitinfer.tokens import encode_text
from tests.splitinfer.decoding.test_exactness import Oracle

WINDOW = 4
MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 32}
# Per family: what its config needs beyond the common tiny shape, chosen to switch on the feature
# that family adds (sliding layers, multipliers, soft-capping, MoE, MLA, partial rotary, NoPE ...).
CONFIGS: dict[str, dict] = {
    "llama": {},
    "mistral": {"sliding_window": WINDOW},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": WINDOW},
    "qwen2": {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 2},
    "qwen2_moe": {"num_experts": 4, "shared_expert_intermediate_size": 32, **MOE},
    "qwen3": {"head_dim": 16},
    "qwen3_moe": {"num_experts": 4, **MOE},
    "gemma": {"head_dim": 16},
    "gemma2": {"head_dim": 16, "sliding_window": WINDOW, "attn_logit_softcapping": 5.0,
               "final_logit_softcapping": 3.0},
    "gemma3_text": {"head_dim": 16, "sliding_window": WINDOW, "final_logit_softcapping": 3.0,
                    "layer_types": ["sliding_attention", "full_attention"] * 2},
    "phi3": {"partial_rotary_factor": 0.5, "sliding_window": WINDOW},
    "olmo2": {},
    "granite": {"embedding_multiplier": 12.0, "logits_scaling": 3.0, "residual_multiplier": 0.22,
                "attention_multiplier": 0.0625},
    "cohere": {"logit_scale": 0.0625},
    "cohere2": {"logit_scale": 0.25, "sliding_window": WINDOW},
    "starcoder2": {"sliding_window": WINDOW},
    "deepseek_v3": {"n_routed_experts": 4, "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 24,
                    "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "n_group": 2, "topk_group": 1,
                    "n_shared_experts": 1, "num_key_value_heads": 4, **MOE},  # MLA: one key head per query head
    "smollm3": {"no_rope_layers": [1, 0, 1, 0]},
    "exaone4": {"sliding_window": WINDOW, "sliding_window_pattern": 2},
    "glm4": {"partial_rotary_factor": 0.5},
    "gpt_oss": {"num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 16, "sliding_window": WINDOW,
                "layer_types": ["sliding_attention", "full_attention"] * 2},
}
REFUSED_CONFIGS: dict[str, dict] = {"gpt_neox": {}, "falcon": {}, "gpt2": {"n_embd": 64, "n_layer": 4, "n_head": 4},
                                    "llama4_text": {"attention_chunk_size": 8}}
PROMPT = "the cat sat on the mat. the"  # 27 byte tokens: many windows of 4
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Call Ann Lee at 555-0199 about invoice 42.",
         "def f(x):\n    return x * 2\n"]
SPLIT = "1,1"  # 4 layers: head 1, body 2, tail 1 (alternating layer types reach both sides)


def tiny_config(name: str, **extra):
    tok = tiny_tokenizer()
    common = {"vocab_size": len(tok), "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
              "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    return AutoConfig.for_model(name, **{**common, **extra})


def build(name: str, seed: int = 0) -> torch.nn.Module:
    """A tiny random model of family ``name``, untouched by splitinfer (same seed -> same weights)."""
    config = tiny_config(name, **CONFIGS.get(name, REFUSED_CONFIGS.get(name, {})))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=families.attn_implementation(config))
    with torch.no_grad():  # larger weights than HF's init, so that logits vary and argmax ties are rare
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.15)
    return model.eval()


def test_every_tested_family_has_a_tiny_config():
    assert set(CONFIGS) == set(families.TESTED)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def fam(request):
    """(family, LoadedModel, an untouched copy of the same model for references, the prompt's ids)."""
    name = request.param
    model, pristine = build(name), build(name)
    loaded = LoadedModel(model, tiny_tokenizer(), f"tiny-{name}", weights_sha256(model), None)
    return name, loaded, pristine, encode_text(loaded.tokenizer, PROMPT).ids


def hf_greedy(model, ids: list[int], n: int):
    """transformers' own greedy generation: (tokens, per-step logits (n, V))."""
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, output_logits=True,
                         return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    return out.sequences[0, len(ids):].tolist(), torch.stack([step[0] for step in out.logits]).float()


def assert_exact(res, tokens, logits):
    assert res.token_ids == tokens
    diff = float((torch.stack(res.logits) - logits).abs().max())
    assert diff <= 1e-4, f"max |dlogit| {diff:.3g}"


def test_split_decoding_equals_unsplit_sequential_and_speculative(fam):
    name, loaded, pristine, ids = fam
    ref_tokens, ref_logits = hf_greedy(pristine, ids, 12)
    sm = SplitModel(loaded, SPLIT, wire_dtype="fp32")
    seq = sm.generate(ids, 12, record_logits=True, stop_on_eos=False)
    assert_exact(seq, ref_tokens, ref_logits)
    # a 5-deep draft of the right continuation with a wrong sibling first at every depth: the body keeps
    # the non-contiguous accepted path (nodes 1, 3, 5, ...) and drops the rest
    spec = sm.generate(ids, 12, record_logits=True, stop_on_eos=False,
                       decoding=Oracle(ref_tokens, len(ids), 5, vocab=loaded.config.vocab_size))
    assert_exact(spec, ref_tokens, ref_logits)
    assert len(spec.steps) < len(seq.steps) and sum(s.draft_accepted for s in spec.steps) > 0


def run_parts(parts, caches, tokens, positions, parents=None):
    head, body, tail = parts
    pos = torch.tensor(positions)
    x = torch.tensor([tokens])
    return tail(body(head(x, pos, caches[0], parents), pos, caches[1], parents), pos, caches[2], parents)[0]


def test_tree_commit_and_crop_leave_the_caches_of_a_chain(fam):
    _, loaded, _, ids = fam
    parts = split_model(loaded.model, SplitConfig.parse(SPLIT))
    n = len(ids)
    chain_caches = [PartKVCache() for _ in range(3)]
    chain = run_parts(parts, chain_caches, ids + [70, 71, 72], list(range(n + 3)))  # (n + 3, V)
    # the prompt, then a tree: root 70 with branches [99, 98] and [71, 72]; commit 70, 71, 72 (nodes 0, 3, 4)
    caches = [PartKVCache() for _ in range(3)]
    run_parts(parts, caches, ids, list(range(n)))
    tree = run_parts(parts, caches, [70, 99, 98, 71, 72], [n, n + 1, n + 2, n + 1, n + 2], [-1, 0, 1, 0, 3])
    assert (tree[[0, 3, 4]] - chain[n:]).abs().max() <= 1e-4
    for c in caches:
        c.keep(n, [0, 3, 4])
    nxt = run_parts(parts, caches, [73], [n + 3])
    ref = run_parts(parts, chain_caches, [73], [n + 3])
    assert (nxt - ref).abs().max() <= 1e-4
    # crop back to 10 entries and feed the rest again as one chunk: the chain's logits
    for c in caches:
        c.crop(10)
    again = run_parts(parts, caches, (ids + [70, 71, 72, 73])[10:], list(range(10, n + 4)))
    assert (again[: n + 3 - 10] - chain[10:]).abs().max() <= 1e-4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small file corpus, and one splitinfer cache for the module (the corpus is read once, not per family)."""
    root = tmp_path_factory.mktemp("fam-corpus")
    path = root / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"doc_id": f"d{i}", "text": t}) for i, t in enumerate(TEXTS)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPLITINFER_CACHE", str(root / "cache"))
        yield path


def test_taps_are_the_models_hidden_states_and_vocab_match_inverts_them(fam, corpus):
    _, loaded, pristine, _ = fam
    taps = extract_depths(loaded, f"file:{corpus}", ["head:1", "head:2"], dtype="fp32", progress=False)
    for boundary, depth in (("head:1", 1), ("head:2", 2)):
        t = taps[boundary]
        start = 0
        for length in t.seq_lengths[:2]:
            ids = torch.as_tensor(t.token_ids[start: start + length])[None]  # (1, T)
            with torch.no_grad():
                want = pristine(ids, output_hidden_states=True).hidden_states[depth][0]  # (T, d)
            got = torch.as_tensor(np.asarray(t.hidden[start: start + length]))
            assert (got - want).abs().max() <= 1e-4 * max(1.0, float(want.abs().max()))
            start += int(length)
    t = taps["head:1"]
    n = len(t)
    train, test = t.select_sequences(range(n - 1)), t.select_sequences([n - 1]).truncate(12)
    # exact white-box inversion; fit trains its linear-embed proposer (ranking candidates) on the train taps plus
    # 512 random-token states of this model (not 8192: faster here); no gradient search
    attack = make_attack("vocab-match", model=loaded, random_tokens=512, grad_steps=0).fit(train)
    assert attack.proposer is not None
    inv = attack.invert(test)
    assert float((inv.tokens == test.token_ids).mean()) == 1.0
    assert inv.info["mean_candidates"] < loaded.config.vocab_size  # the fitted ranking beats a full scan


def test_a_family_whose_states_leave_fp16s_range_sends_bf16_by_default(corpus):
    """Gemma's states exceed fp16's 65,504 (Gemma 3 270M's BOS state at every depth): on an fp16 wire the runtime
    refuses them. A Gemma split now sends bf16 unless told otherwise, and the attack grid's taps are rounded as on
    that wire (before: fp16 everywhere, and the attack and defense stages on Gemma 3 270M stopped at the first
    generation). Other families keep fp16."""
    from benchmarks.attack_grid import extract_split
    from attacks.boundary import Boundary

    model = build("gemma3_text")
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(1e6)  # states far beyond fp16's range, as in Gemma 3 270M
    loaded = LoadedModel(model, tiny_tokenizer(), "tiny-gemma3_text", weights_sha256(model), None)
    ids = encode_text(loaded.tokenizer, PROMPT).ids
    with pytest.raises(SplitInferError, match="NaN or Inf"):
        SplitModel(loaded, "1,1", wire_dtype="fp16").generate(ids, 4, stop_on_eos=False)
    sm = SplitModel(loaded, "1,1")
    assert sm.wire_dtype_name == "bf16" and sm.wire_dtype == torch.bfloat16
    assert len(sm.generate(ids, 4, stop_on_eos=False).token_ids) == 4
    taps = extract_split(loaded, f"file:{corpus}", [Boundary("head", 1)], "all", 400, 32)[Boundary("head", 1)]
    h = np.asarray(taps.hidden)
    assert taps.meta["wire_dtype"] == "bf16" and np.isfinite(h).all() and np.abs(h).max() > 65504
    assert np.array_equal(h, torch.from_numpy(h).to(torch.bfloat16).float().numpy())  # rounded as on the wire
    assert SplitModel(LoadedModel(build("llama"), tiny_tokenizer(), "tiny-llama", "0", None), "1,1").wire_dtype_name \
        == "fp16"


ROUTERS = {"gate", "shared_expert_gate"}  # MoE routing scores, left as they are


def test_lora_random_defense_reaches_the_head_and_stays_exact(fam):
    _, loaded, _, ids = fam
    sm = SplitModel(loaded, SPLIT, wire_dtype="fp32", defense="lora-random",
                    defense_options={"lora-random.scale": 0.2})
    private = dict(sm.head.layers[0].named_modules())
    untouched = {n for n, m in loaded.model.model.layers[0].named_modules() if isinstance(m, torch.nn.Linear)
                 and n.rpartition(".")[2] not in ROUTERS and torch.equal(m.weight, private[n].weight)}
    assert not untouched, f"lora-random leaves these linear maps of the head as published: {sorted(untouched)}"
    public = LocalHead(loaded.model, SplitConfig.parse(SPLIT))
    x, pos = torch.tensor([ids]), torch.arange(len(ids))
    moved = (sm.head(x, pos, PartKVCache()) - public(x, pos, PartKVCache()))[0].norm(dim=-1)  # (T,)
    assert bool((moved > 1e-3).all())
    private = with_head_layers(loaded.model, list(sm.head.layers))
    tokens, logits = hf_greedy(private, ids, 6)
    assert_exact(sm.generate(ids, 6, record_logits=True, stop_on_eos=False), tokens, logits)


# ---------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("name", sorted(REFUSED_CONFIGS))
def test_unsplittable_family_is_refused_at_load_in_one_line(name, tmp_path):
    model = build(name)
    model.config.save_pretrained(tmp_path)  # no weights: the refusal comes before they would load
    tiny_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(SplitInferError) as err:
        load_model(str(tmp_path))
    message = str(err.value)
    assert "\n" not in message and f"cannot split model family {name!r}" in message
    assert families.REFUSED[name].split(",")[0] in message
    with pytest.raises(SplitInferError, match=f"cannot split model family {name!r}"):
        split_model(model, SplitConfig(1, 1))


def test_untested_family_is_refused_unless_allowed(monkeypatch, caplog):
    model = build("olmo")  # lays out like Llama, but nobody has checked it
    monkeypatch.delenv(families.ALLOW_ENV, raising=False)
    with pytest.raises(SplitInferError, match="model family 'olmo' .* is untested.*SPLITINFER_ALLOW_UNTESTED=1"):
        LoadedModel(model, tiny_tokenizer(), "tiny-olmo", "x", None)
    monkeypatch.setenv(families.ALLOW_ENV, "1")
    with caplog.at_level("WARNING"):
        loaded = LoadedModel(model, tiny_tokenizer(), "tiny-olmo", "x", None)
    assert "untested" in caplog.text and loaded.num_layers == 4


def test_gemma2_directory_loads_with_eager_attention_and_splits_exactly(tmp_path):
    """Gemma 2 has no sdpa path (soft-capping): loading asked for sdpa and failed; it now loads eager and,
    with an additive mask, splits exactly."""
    pristine = build("gemma2")
    pristine.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    assert loaded.config._attn_implementation == "eager"
    sm = SplitModel(loaded, SPLIT, wire_dtype="fp32")
    ids = sm.encode_prompt(PROMPT)
    tokens, logits = hf_greedy(pristine, ids, 6)
    assert_exact(sm.generate(ids, 6, record_logits=True, stop_on_eos=False), tokens, logits)


def test_granite_embedding_multiplier_moves_into_the_module_once():
    model = build("granite")
    x = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        before = model(x).logits
    families.prepare(model)
    families.prepare(copy.copy(model))  # idempotent, also on a shallow copy
    assert isinstance(model.model.embed_tokens, families.MultipliedEmbedding)
    assert model.model.embedding_multiplier == 1.0 and model.model.embed_tokens.multiplier == 12.0
    assert "model.embed_tokens.weight" in model.state_dict()
    with torch.no_grad():
        assert torch.equal(model(x).logits, before)
