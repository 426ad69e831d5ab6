"""query-match: a body party that receives another party's queries recovers that party's text from them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attacks.errors import AttackError
from attacks.registry import make_attack
from attacks.tapdata import Taps
from splitinfer.models import LoadedModel, tiny_tokenizer, weights_sha256
from tests.attacks.recipes._tiny_taps import tiny_head_taps
from tests.splitinfer.test_families import build


@pytest.fixture(scope="module")
def taps(tiny, tmp_path_factory):
    return tiny_head_taps(tiny, tmp_path_factory.mktemp("qm"))


def _scaled(taps: Taps, factor: np.ndarray) -> Taps:
    return Taps(np.asarray(taps.hidden, np.float32) * factor[:, None], taps.token_ids, taps.seq_lengths,
                taps.seq_doc, taps.documents, taps.offsets, taps.meta)


def test_the_queries_alone_give_back_the_text(tiny, taps):
    train, test = taps.select_sequences(range(4, 20)), taps.select_sequences([0, 1, 2])
    atk = make_attack("query-match", model=tiny, proposer_tokens=2000, random_tokens=512).fit(train)
    inv = atk.invert(test, k=3)
    assert (inv.tokens == test.token_ids).all()
    # it reads each state only through its query, which the RMSNorm makes blind to the state's scale: states
    # scaled by a different factor per row (their queries the same) give the same answer
    factor = np.random.default_rng(0).uniform(0.5, 4.0, size=test.n_tokens).astype(np.float32)
    assert np.array_equal(atk.invert(_scaled(test, factor), k=3).tokens, inv.tokens)
    view = atk._observed(test)
    heads = tiny.model.config.num_attention_heads
    assert view.hidden.shape == (test.n_tokens, heads * 16) and view.meta["view"] == "query"


def _captured_queries(model: torch.nn.Module, ids: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, d) input of layer ``depth`` and (T, H * D_h) the query rows that layer computes (before rotary),
    caught from its own modules during an ordinary forward."""
    att, got = model.model.layers[depth].self_attn, {}
    norm = getattr(att, "q_norm", None)
    hook = (norm or att.q_proj).register_forward_hook(lambda m, a, out: got.setdefault("q", out.detach()))
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states[depth][0]
    hook.remove()
    q = got["q"]  # (1, T, H * D_h), (1, T, H, D_h), or (1, H, T, D_h) where the norm runs after the transpose
    if q.dim() == 4 and q.shape[1] != ids.shape[1]:
        q = q.transpose(1, 2)
    return hidden, q.reshape(ids.shape[1], -1)


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3", "olmo2"])
def test_the_view_is_the_query_the_layer_computes(family):
    model = build(family)
    loaded = LoadedModel(model, tiny_tokenizer(), f"tiny-{family}", weights_sha256(model), None)
    atk = make_attack("query-match", model=loaded)
    ids = torch.tensor([list(b"the cat sat on the mat.")])
    hidden, expected = _captured_queries(model, ids, 2)
    assert torch.allclose(atk.queries(hidden, 2), expected, atol=1e-5)


def test_bad_input_is_an_attack_error(tiny):
    with pytest.raises(AttackError, match="defense=none"):
        make_attack("query-match", defense="noise(sigma=0.1,clip=1.0)")
    atk = make_attack("query-match", model=tiny)
    with pytest.raises(AttackError, match="no body layer"):
        atk.queries(torch.zeros(1, 64), 0)


def test_the_gradient_search_descends_in_the_query_space(tiny, taps):
    """The SipIt-style search that finds a token the proposer missed compares the candidate's query, not its
    state, with the observed query (before: the state, which matches nothing)."""
    from attacks.recipes.vocab_match import _PrefixCache
    from attacks.taps import TruncatedForward

    atk = make_attack("query-match", model=tiny, proposer_tokens=2000, random_tokens=512, grad_steps=30,
                      grad_check=5, grad_topk=2).fit(taps.select_sequences(range(4, 20)))
    test = taps.select_sequences([0])
    obs = torch.from_numpy(atk._observed(test).hidden[0])  # (H * D_h,) the first position's query
    emb = tiny.model.get_input_embeddings().weight.detach()  # (V, d_e)
    ctx = {"stack": TruncatedForward(tiny.model, 2).eval(), "embed": tiny.model.get_input_embeddings(),
           "device": torch.device("cpu"), "emb": emb, "emb_std": float(emb.std()), "cache": _PrefixCache(),
           "obs": obs, "pos": torch.tensor([0]), "tried": np.zeros(len(emb), bool), "ids": [], "dists": [],
           "best": float("inf"), "best_kv": None, "forwards": 0, "grad_steps": 0}
    with torch.no_grad():  # as in the search (_invert), which turns gradients on for the descent alone
        assert atk._gradient_search(ctx, emb.mean(0))
    assert int(np.concatenate(ctx["ids"])[np.argmin(np.concatenate(ctx["dists"]))]) == int(test.token_ids[0])
