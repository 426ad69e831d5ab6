"""Defended taps and victims: what the attackers see equals what the runtime sends; lora victims stay private."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from attacks.defended import attacker_view, defend_taps, victim_model
from attacks.taps import extract_depths
from splitinfer.client import SplitModel
from splitinfer.defenses import DefensePipeline
from tests.attacks.recipes.test_vocab_match import TEXTS


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("defended")
    path = root / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"doc_id": f"d{i}", "text": t}) for i, t in enumerate(TEXTS * 3)))
    os.environ.setdefault("SPLITINFER_CACHE", str(root / "cache"))
    return f"file:{path}"


@pytest.mark.parametrize("spec", ["noise(sigma=0.3,clip=2.0,seed=4)", "quant(format=int4,group=16)",
                                  "noise(sigma=0.1,clip=2.0)+quant(format=fp8)"])
def test_defended_taps_are_what_the_cloud_receives(tiny, corpus, spec):
    taps = extract_depths(tiny, corpus, ["head:2"], dtype="fp16", progress=False)["head:2"]
    pipe = DefensePipeline.parse(spec)
    got = defend_taps(taps, pipe)
    assert got.meta["defense"] == pipe.label and got.hidden.dtype == np.float32
    assert not np.array_equal(got.hidden, taps.hidden.astype(np.float32))
    # the runtime, on the first sequence's tokens as a prompt (its first session: session 0)
    seq0 = taps.token_ids[: taps.seq_lengths[0]].tolist()
    sm = SplitModel(tiny, "2,1", defense=pipe)
    seen = []
    body = sm.link.service.body
    sm.link.service.body = lambda h, *a: (seen.append(h[0].clone()), body(h, *a))[1]
    sm.generate(seq0, 1)
    assert torch.equal(seen[0], torch.from_numpy(got.hidden[: len(seq0)]).to(seen[0].dtype))
    # an adaptive attacker's own simulation uses other draws
    if "noise" in spec:
        mine = defend_taps(taps, attacker_view(pipe))
        assert not np.array_equal(mine.hidden, got.hidden)


def test_victim_model_changes_only_its_copy(tiny, corpus):
    w = tiny.model.model.layers[1].self_attn.o_proj.weight.clone()
    victim = victim_model(tiny, DefensePipeline.parse("lora-random(rank=2,scale=0.2)"), depth=2)
    assert victim.sha256 != tiny.sha256
    assert torch.equal(tiny.model.model.layers[1].self_attn.o_proj.weight, w)
    assert not torch.equal(victim.model.model.layers[1].self_attn.o_proj.weight, w)
    assert victim.model.model.layers[2] is tiny.model.model.layers[2]
    clean = extract_depths(tiny, corpus, ["head:2"], dtype="fp32", progress=False)["head:2"]
    priv = extract_depths(victim, corpus, ["head:2"], dtype="fp32", progress=False)["head:2"]
    assert not np.allclose(clean.hidden, priv.hidden, atol=1e-3)
    # the victim's states are those of the runtime's lora-random head
    sm = SplitModel(tiny, "2,1", defense="lora-random(rank=2,scale=0.2)")
    ids = priv.token_ids[: priv.seq_lengths[0]]
    h = sm.head(torch.tensor([ids.tolist()]), torch.arange(len(ids)), sm.head.new_cache())[0]
    assert torch.allclose(h, torch.from_numpy(priv.hidden[: len(ids)]), atol=1e-5)


def test_public_positions_released_untouched():
    """Template tokens and tokens the tokenizer added (no characters) reach the cloud as they are under noise;
    before, noise clipped and noised them like user text."""
    from attacks.defended import public_mask
    from attacks.tapdata import Taps

    text = "<|user|>hi there"  # template span [0, 8)
    offsets = np.array([[0, 0], [0, 8], [8, 10], [10, 16]], dtype=np.int32)  # an added BOS, template, user, user
    hidden = (np.random.default_rng(0).standard_normal((4, 16)) * 50).astype(np.float16)
    taps = Taps(hidden, np.array([1, 2, 3, 4]), np.array([4]), np.array([0]),
                [{"doc_id": "d", "text": text, "template_spans": [{"start": 0, "end": 8}]}], offsets)
    assert public_mask(taps, 0, slice(0, 4)).tolist() == [True, True, False, False]
    got = defend_taps(taps, DefensePipeline.parse("noise(sigma=0.1,clip=1.0)"))
    assert np.array_equal(got.hidden[:2], hidden[:2].astype(np.float32))
    assert (np.linalg.norm(got.hidden[2:], axis=1) < 3.0).all()


def test_traffic_is_made_only_for_attacks_that_read_it():
    """show_traffic hands the deployment's released states to an attack with observe_traffic; for any other it
    does not even make them (defending a whole test pool costs time)."""
    from attacks.defended import show_traffic

    made, seen = [], []

    class Reads:
        def observe_traffic(self, released):
            seen.append(released)

    show_traffic(object(), lambda: made.append(1))
    assert made == []
    show_traffic(Reads(), lambda: "states")
    assert seen == ["states"]
