"""Batch-invariant kernels: bit-for-bit equal logits whatever the number of tokens in a forward.

Unit checks of the padded linear and the per-row attention, then the property
that matters: every proposer's logits equal sequential decoding's exactly
(``torch.equal``, not a tolerance), in process and over the real server, and a
clear refusal when only one side uses the kernels.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from splitinfer import batch_invariant as bi
from splitinfer.client import SplitModel, body_info
from splitinfer.decoding.base import list_proposers
from splitinfer.link import InProcessLink
from splitinfer.models import load_model
from splitinfer.partition import CloudBody, SplitConfig
from splitinfer.remote import CloudError
from splitinfer.session import BodyService, ServiceLimits
from splitinfer.ws_link import WebSocketLink
from tests.splitinfer.ws_helpers import ServerProcess

PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat"
OPTIONS = {"jacobi": {"block": 6}, "lookahead": {"window": 3, "ngram": 4, "pool": 3},
           "combined": {"step_ms": 60.0, "token_ms": 1.0}}  # fixed costs: the tree does not shrink on a loaded machine
TOKEN = "batch-invariant-test-token-0123456789"


@pytest.fixture(scope="module")
def tiny_bi():
    """The tiny random model (same weights as the ``tiny`` fixture) with batch-invariant kernels."""
    return load_model("tiny-random", batch_invariant=True)


def _rows_invariant(weight, multiple) -> bool:
    x = torch.randn(45, weight.shape[1], generator=torch.Generator().manual_seed(1))  # (45, K)
    alone = torch.cat([bi._padded_linear(x[i : i + 1], weight, None, multiple) for i in range(45)])
    return all(torch.equal(bi._padded_linear(x[s : s + m], weight, None, multiple), alone[s : s + m])
               for m in range(1, 40) for s in (0, 3))


def test_the_probed_padding_makes_every_row_independent_of_the_row_count():
    weight = torch.randn(96, 80, generator=torch.Generator().manual_seed(0))  # (N, K)
    multiple = bi.probe_linear(weight)
    assert multiple in (*bi.PAD_CHOICES, bi.ROWS)
    assert _rows_invariant(weight, multiple)


def test_row_by_row_products_are_invariant_and_correct():
    weight = torch.randn(96, 80, generator=torch.Generator().manual_seed(0))
    assert _rows_invariant(weight, bi.ROWS)
    x = torch.randn(7, 80)
    assert torch.allclose(bi._padded_linear(x, weight, None, bi.ROWS), x @ weight.T, atol=1e-5)


def test_an_enabled_linear_keeps_its_parameter_names_and_computes_the_same_function():
    lin = torch.nn.Linear(80, 96)
    x = torch.randn(2, 5, 80)  # (B, T, K)
    want = lin(x)
    cfg = type("Cfg", (), {})()
    shapes = bi.enable(torch.nn.Sequential(lin), config=cfg)
    assert list(shapes) == ["96x80+bias float32 cpu"] and cfg._attn_implementation == bi.ATTENTION_NAME
    assert bi.enable(torch.nn.Sequential(lin), config=cfg) == shapes  # idempotent
    assert [n for n, _ in lin.named_parameters()] == ["weight", "bias"]
    assert torch.allclose(lin(x), want, atol=1e-5) and lin(x).shape == (2, 5, 96)


def test_attention_computes_what_sdpa_computes_for_causal_and_tree_masks():
    torch.manual_seed(0)
    module = type("Attn", (), {"num_key_value_groups": 2})()
    q = torch.randn(1, 4, 5, 16)  # (B, H, T, D)
    k, v = torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)  # (B, H_kv, S, D): 4 cached + 5 new
    tree = torch.ones(5, 9, dtype=torch.bool)
    tree[:, 4:] = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 0, 0, 1]],
                               dtype=torch.bool)
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    cases = [  # (query, keys, mask given, what sdpa should see)
        (q, slice(0, 5), None, torch.ones(5, 5, dtype=torch.bool).tril()),  # no mask, no cache: causal
        (q[:, :, :1], slice(0, 9), None, torch.ones(1, 9, dtype=torch.bool)),  # no mask, one query: every key
        (q, slice(0, 9), tree[None, None], tree),  # a token tree after 4 cached keys
        (q, slice(0, 9), torch.where(tree, 0.0, torch.finfo(torch.float32).min)[None, None], tree),  # additive
    ]
    for query, keys, mask, ref_mask in cases:
        got, _ = bi.batch_invariant_attention(module, query, k[:, :, keys], v[:, :, keys], mask, scaling=0.25)
        want = F.scaled_dot_product_attention(query, kr[:, :, keys], vr[:, :, keys], attn_mask=ref_mask,
                                              scale=0.25).transpose(1, 2)  # (B, T, H, D)
        assert torch.allclose(got, want, atol=1e-6)


def test_attention_refuses_what_it_does_not_implement():
    module = type("Attn", (), {"num_key_value_groups": 1})()
    q = k = v = torch.randn(1, 2, 3, 8)
    with pytest.raises(bi.SplitInferError, match="soft-capping"):
        bi.batch_invariant_attention(module, q, k, v, None, softcap=30.0)
    with pytest.raises(bi.SplitInferError, match="shared by all heads"):
        bi.batch_invariant_attention(module, q, k, v, torch.ones(1, 2, 3, 3, dtype=torch.bool))
    with pytest.raises(bi.SplitInferError, match=r"mask of shape \[1, 1, 3, 4\] for 3 queries and 3 keys"):
        bi.batch_invariant_attention(module, q, k, v, torch.ones(1, 1, 3, 4, dtype=torch.bool))
    with pytest.raises(bi.SplitInferError, match="not additive attention biases"):
        bi.batch_invariant_attention(module, q, k, v, torch.full((1, 1, 3, 3), 0.5))


@pytest.mark.parametrize("name", [n for n in list_proposers() if n != "sequential"])
def test_every_proposer_gives_sequentials_logits_bit_for_bit(tiny_bi, name, feature_head_dir):
    sm = SplitModel(tiny_bi, "2,2", wire_dtype="fp32")
    options = {**OPTIONS.get(name, {}), **({"draft_head": str(feature_head_dir)} if name == "feature-draft" else {})}
    ref = sm.generate(PROMPT, 40, record_logits=True, stop_on_eos=False)
    res = sm.generate(PROMPT, 40, record_logits=True, stop_on_eos=False, decoding=name, decoding_options=options)
    assert res.token_ids == ref.token_ids
    assert torch.equal(torch.stack(res.logits), torch.stack(ref.logits))
    # model drafters on a random model may not draft, nor may REST: a random model's output matches no public text
    if name not in ("local-draft", "feature-draft", "rest"):
        assert sum(s.draft_tokens for s in res.steps) > 0  # drafts were really verified


def test_the_unsplit_model_gives_the_split_models_logits_bit_for_bit(tiny_bi):
    from benchmarks.exactness import unsplit_reference

    sm = SplitModel(tiny_bi, "1,1", wire_dtype="fp32")
    ids = sm.encode_prompt(PROMPT)
    res = sm.generate(ids, 24, record_logits=True, stop_on_eos=False)
    tokens, logits = unsplit_reference(tiny_bi, ids, 24)
    assert tokens == res.token_ids and torch.equal(logits, torch.stack(res.logits))


def test_a_client_with_the_kernels_refuses_a_body_without_them(tiny, tiny_bi):
    split = SplitConfig(2, 2)
    body = CloudBody.from_model(tiny.model, split)  # the default kernels
    info = body_info("tiny-random", split, body, tiny.hidden_size, tiny.num_layers)
    assert info.batch_invariant is False
    link = InProcessLink(BodyService(body, info, ServiceLimits()))
    with pytest.raises(CloudError, match="batch_invariant mismatch.*--batch-invariant"):
        SplitModel(tiny_bi, "2,2", cloud=link)


def test_a_batch_invariant_server_process_is_bit_for_bit_exact(tiny_bi, tiny_dir, tmp_path, feature_head_dir):
    (tmp_path / "token").write_text(TOKEN + "\n")
    proc = ServerProcess(tiny_dir, "--token-file", str(tmp_path / "token"), "--batch-invariant",
                         log_dir=tmp_path).wait_ready()
    try:
        remote = SplitModel(tiny_bi, "2,2", cloud=WebSocketLink(proc.url, token=TOKEN), wire_dtype="fp32")
        assert remote.remote.server_info["batch_invariant"] is True
        # the reference is sequential decoding through the same server: its process runs one thread, and
        # another thread count may round differently (the kernels are invariant to the batch, not the machine)
        ref = remote.generate(PROMPT, 32, record_logits=True, stop_on_eos=False)
        for name in ("prompt-lookup", "combined", "feature-draft"):
            got = remote.generate(PROMPT, 32, record_logits=True, stop_on_eos=False, decoding=name,
                                  decoding_options={"draft_head": str(feature_head_dir)}
                                  if name == "feature-draft" else None)
            assert got.token_ids == ref.token_ids and torch.equal(torch.stack(got.logits), torch.stack(ref.logits))
        remote.close()
    finally:
        proc.stop()
