import pytest
import torch

from splitinfer.errors import SplitInferError
from splitinfer.kv_cache import PartKVCache
from splitinfer.models import load_model, weights_sha256
from splitinfer.partition import CloudBody, SplitConfig, layer_types, param_bytes, split_model


def run_split(model, split, ids, chunks):
    """Run head -> body -> tail over ids (1, N) in the given chunk sizes; return logits (N, V)."""
    head, body, tail = split_model(model, split)
    caches = [PartKVCache() for _ in range(3)]
    out, start = [], 0
    for n in chunks:
        pos = torch.arange(start, start + n)
        x = head(ids[:, start : start + n], pos, caches[0])
        x = body(x, pos, caches[1])
        out.append(tail(x, pos, caches[2])[0])
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("bad", ["0,2", "2,0", "3,3", "5,1", "-1,2"])
def test_bad_splits_raise_clear_error(tiny, bad):
    with pytest.raises(SplitInferError, match="bad split"):
        split_model(tiny.model, SplitConfig.parse(bad))


def test_split_parse_errors():
    with pytest.raises(SplitInferError, match="HEAD,TAIL"):
        SplitConfig.parse("2")
    with pytest.raises(SplitInferError, match="HEAD,TAIL"):
        SplitConfig.parse("a,b")
    assert SplitConfig.parse(" 2, 3") == SplitConfig(2, 3)


@pytest.mark.parametrize("split", [SplitConfig(1, 1), SplitConfig(2, 2), SplitConfig(1, 4), SplitConfig(3, 2)])
def test_split_forward_equals_unsplit(tiny, split):
    ids = torch.tensor([tiny.tokenizer("The quick brown fox jumps over the lazy dog.")["input_ids"]])
    with torch.no_grad():
        ref = tiny.model(ids).logits[0]
    n = ids.shape[1]
    assert torch.allclose(run_split(tiny.model, split, ids, [n]), ref, atol=1e-5)
    # incremental: prefill then one token at a time, as in decoding
    inc = run_split(tiny.model, split, ids, [5] + [1] * (n - 5))
    assert torch.allclose(inc, ref, atol=1e-4)


def test_body_from_model_holds_no_embedding_or_lm_head(tiny):
    _, body, _ = split_model(tiny.model, SplitConfig(2, 2))
    names = list(body.state_dict())
    assert names and all(k.startswith("layers.") for k in names)
    assert not hasattr(body, "embed_tokens") and not hasattr(body, "lm_head")
    assert [type(m).__name__ for m in body.modules() if isinstance(m, torch.nn.Embedding)] == []


def test_body_from_weights_reads_only_body_layers(tiny, tiny_dir):
    split = SplitConfig(2, 1)
    body = CloudBody.from_weights(tiny_dir, split)
    assert all(k.startswith("layers.") for k in body.state_dict())
    assert not any(isinstance(m, torch.nn.Embedding) for m in body.modules())
    assert len(body.layers) == tiny.num_layers - 3 and body.first_layer == 2
    ref = CloudBody.from_model(tiny.model, split)
    assert weights_sha256(body) == weights_sha256(ref)
    assert param_bytes(body) < param_bytes(tiny.model)
    x = torch.randn(1, 7, tiny.hidden_size)
    pos = torch.arange(7)
    assert torch.equal(body(x, pos, PartKVCache()), ref(x, pos, PartKVCache()))


def test_body_from_weights_missing_checkpoint(tmp_path, tiny):
    tiny.model.config.save_pretrained(tmp_path)
    with pytest.raises(SplitInferError, match="no model.safetensors"):
        CloudBody.from_weights(tmp_path, SplitConfig(1, 1))


def test_layer_types_default_full(tiny):
    assert set(layer_types(tiny.model.config)) == {"full_attention"}


def test_tree_forward_matches_chains(tiny):
    """A two-branch token tree gives each branch the logits of that branch run as a chain."""
    model = tiny.model
    prompt = tiny.tokenizer("Hello")["input_ids"]
    a, b = [10, 11, 12], [20, 21]
    # tree nodes: root r=5, then chain a under r, then chain b under r
    tokens = [5] + a + b
    parents = [-1, 0, 1, 2, 0, 4]
    head, body, tail = split_model(model, SplitConfig(2, 2))

    def prefix_caches():
        caches = [PartKVCache() for _ in range(3)]
        pos = torch.arange(len(prompt))
        x = tail(body(head(torch.tensor([prompt]), pos, caches[0]), pos, caches[1]), pos, caches[2])
        return caches

    caches = prefix_caches()
    base = len(prompt)
    from splitinfer.decoding.tree import depths

    pos = torch.tensor([base + d for d in depths(parents)])
    x = head(torch.tensor([tokens]), pos, caches[0], parents)
    tree_logits = tail(body(x, pos, caches[1], parents), pos, caches[2], parents)[0]
    for chain, nodes in (([5] + a, [0, 1, 2, 3]), ([5] + b, [0, 4, 5])):
        c = prefix_caches()
        p = torch.arange(base, base + len(chain))
        ref = tail(body(head(torch.tensor([chain]), p, c[0]), p, c[1]), p, c[2])[0]
        assert torch.allclose(tree_logits[nodes], ref, atol=1e-4)
    # keep the b-branch: caches then equal a chain run of [5] + b
    for c in caches:
        c.keep(base, [0, 4, 5])
    assert caches[0].positions.tolist() == list(range(base + 3))


def test_unknown_dtype_and_spec():
    with pytest.raises(SplitInferError, match="unknown dtype"):
        load_model("tiny-random", dtype="int8")
    with pytest.raises(SplitInferError, match="unknown model spec"):
        load_model("not-a-model")
    with pytest.raises(SplitInferError, match="GGUF file not found"):
        load_model("/nonexistent/x.gguf")
