"""lm-prior-match: the noise scale estimated from the states, and the public model's prior steering the beam."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attacks.defended import attacker_view, defend_taps
from attacks.errors import AttackError
from attacks.recipes.lm_prior_match import estimate_noise_var
from attacks.registry import make_attack
from splitinfer.defenses import DefensePipeline
from splitinfer.defenses.noise import clip_rows
from tests.attacks.recipes._tiny_taps import tiny_head_taps


@pytest.fixture(scope="module")
def taps(tiny, tmp_path_factory):
    return tiny_head_taps(tiny, tmp_path_factory.mktemp("lpm"))


def test_noise_scale_estimated_from_the_states(taps):
    pipe = DefensePipeline.parse("noise(sigma=0.1,clip=3.0)")
    clean_sq = float(clip_rows(torch.from_numpy(np.asarray(taps.hidden, np.float32)), 3.0).pow(2).sum(-1).mean())
    var = estimate_noise_var(defend_taps(taps, pipe).hidden, clean_sq)
    assert var ** 0.5 == pytest.approx(0.1 * 3.0, rel=0.1)  # sigma * C per coordinate


def _fit(tiny, taps, spec, **hp):
    pipe = DefensePipeline.parse(spec)
    return make_attack("lm-prior-match", model=tiny, defense=pipe.shareable_label, beam=2, proposer_tokens=2000,
                       random_tokens=512, **hp).fit(defend_taps(taps, attacker_view(pipe))), pipe


def test_the_prior_decides_where_the_states_say_nothing(tiny, taps):
    """sigma = 30: the states carry no information, so the path is the public model's own likeliest text."""
    atk, pipe = _fit(tiny, taps, "noise(sigma=30.0,clip=3.0)")
    test = defend_taps(taps.select_sequences([0]).truncate(3), pipe)
    inv = atk.invert(test, k=2)
    bos = tiny.tokenizer.bos_token_id if tiny.tokenizer.bos_token_id is not None else tiny.tokenizer.eos_token_id
    with torch.no_grad():
        first = int(tiny.model(torch.tensor([[bos]])).logits[0, -1].argmax())
    assert inv.tokens[0] == first
    assert inv.info["lm_weight"] == 1.0 and inv.info["estimated_noise_std"] > 10
    flat, _ = _fit(tiny, taps, "noise(sigma=30.0,clip=3.0)", lam=0.0)
    assert flat.invert(test, k=2).info["lm_weight"] == 0.0


def test_matches_under_moderate_noise(tiny, taps):
    atk, pipe = _fit(tiny, taps, "noise(sigma=0.1,clip=3.0)")
    test = defend_taps(taps.select_sequences([0, 1]), pipe)
    assert float((atk.invert(test, k=1).tokens == test.token_ids).mean()) > 0.9


def test_bad_options_are_attack_errors():
    with pytest.raises(AttackError, match="noise_scale"):
        make_attack("lm-prior-match", noise_scale="guess")
    with pytest.raises(AttackError, match="lam=-1"):
        make_attack("lm-prior-match", lam=-1)
