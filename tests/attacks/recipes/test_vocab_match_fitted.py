"""vocab-match-fitted: a self-fitted adapter moves the public head toward a privately perturbed victim's and
recovers more than the public search; without private layers it is vocab-match-adaptive."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attacks.defended import defend_taps, knowledge_label, threat_label, victim_model
from attacks.errors import AttackError
from attacks.recipes.vocab_match import match_distance
from attacks.registry import get_attack_class, make_attack
from attacks.tapdata import Taps
from attacks.taps import TruncatedForward
from splitinfer.defenses import DefensePipeline
from tests.attacks.recipes.test_vocab_match_adaptive import taps  # noqa: F401 (the module's fixture)

VICTIM = "lora-random(rank=4,scale=0.1,seed=8)"  # public search 0.688 on the 3 test sequences, fitted 1.0 (measured)
FAST = {"proposer_tokens": 2000, "random_tokens": 512, "grad_steps": 0}


def head_states(loaded, taps: Taps, depth: int) -> np.ndarray:
    """(N, d) float32 states of ``loaded``'s head on the taps' own token sequences, rounded like an fp16 wire."""
    stack = TruncatedForward(loaded.model, depth).eval()
    out = np.empty(taps.hidden.shape, dtype=np.float32)
    for _, rows in taps.sequences():
        ids = torch.from_numpy(np.asarray(taps.token_ids[rows], dtype=np.int64))[None]  # (1, T)
        out[rows] = stack(ids)[0].to(torch.float16).float().numpy()
    return out


@pytest.fixture(scope="module")
def victim(tiny, taps):  # noqa: F811
    """(attacker's training taps, the victim's test taps: its private head's states, the public model's meta)."""
    test = taps.select_sequences(range(3))
    private = victim_model(tiny, DefensePipeline.parse(VICTIM), 2)
    seen = Taps(head_states(private, test, 2), test.token_ids, test.seq_lengths, test.seq_doc, test.documents,
                test.offsets, test.meta)
    return taps, seen, private


def _acc(inv, taps: Taps) -> float:
    return float((inv.tokens == taps.token_ids).mean())


def test_the_fitted_head_is_closer_to_the_victim_and_recovers_more(tiny, victim):
    train, test, private = victim
    # the public head under the fitted attacker's own search (one path, the proposer's first 256 candidates): the
    # adaptive attacker's beam over the whole vocabulary recovers everything here (1.0) and would hide the fit
    public = make_attack("vocab-match-adaptive", model=tiny, defense="lora-random(rank=4,scale=0.1)", **FAST,
                         beam=1, full_vocab_max=1, capped_candidates=256)
    base = public.fit(train).invert(test, k=2)
    atk = make_attack("vocab-match-fitted", model=tiny, defense="lora-random(rank=4,scale=0.1)", **FAST).fit(train)
    inv = atk.invert(test, k=2)
    assert _acc(base, test) < 0.8  # the public head is clearly wrong here (0.688 measured)
    assert _acc(inv, test) > _acc(base, test)  # 1.0 measured
    info = inv.info
    assert info["adapter_fitted"] and info["adapter_rounds"] == 1 and info["adapter_chosen_round"] == 1
    assert info["adapter_rank"] == 4  # the defense's public rank
    assert 0 < info["adapter_positions_used"] < test.n_tokens and info["adapter_positions_held_out"] > 0
    assert info["adapter_fit_loss"] < info["adapter_fit_loss_initial"] and info["adapter_seconds"] > 0
    assert info["adapter_mean_distance"] < info["adapter_mean_distance_public"]
    # on the true tokens, the adapted head's states are nearer the victim's than the public head's
    obs = torch.from_numpy(np.asarray(test.hidden, dtype=np.float32))  # (N, d)
    near = {name: float(match_distance(torch.from_numpy(head_states(m, test, 2)), obs).mean())
            for name, m in (("public", tiny), ("adapted", atk.adapted), ("victim", private))}
    assert near["victim"] < 1e-3 and near["adapted"] < 0.8 * near["public"], near


def test_a_few_rows_are_still_fitted(tiny, victim):
    train, test, _ = victim
    atk = make_attack("vocab-match-fitted", model=tiny, defense="lora-random(rank=4,scale=0.1)", fit_steps=5,
                      **FAST).fit(train)
    for short, held in ((test.select_sequences([0]).truncate(3), 0), (test.truncate(4), 2)):  # 3 rows; 3 x 4 rows
        inv = atk.invert(short, k=1)
        assert inv.topk.shape == (short.n_tokens, 1) and inv.info["adapter_fitted"]
        assert inv.info["adapter_positions_held_out"] == held and inv.info["adapter_positions_used"] > 0


@pytest.mark.parametrize("spec", ["none", "quant(format=int4,group=16)"])
def test_without_private_layers_it_is_vocab_match_adaptive(tiny, taps, spec):  # noqa: F811
    pipe = DefensePipeline.parse(spec)
    test = taps.select_sequences(range(2))
    seen = defend_taps(test, pipe)
    got = {n: make_attack(n, model=tiny, defense=spec, **FAST).fit(taps).invert(seen, k=3)
           for n in ("vocab-match-adaptive", "vocab-match-fitted")}
    a, f = got["vocab-match-adaptive"], got["vocab-match-fitted"]
    assert np.array_equal(a.topk, f.topk) and np.array_equal(a.scores, f.scores)
    assert f.info["adapter_fitted"] is False and "no adapter fitted" in f.info["adapter_note"]
    assert "adapter_fitted" not in a.info


@pytest.mark.parametrize("hp, fix", [({"rounds": 0}, "rounds=1"), ({"fit_steps": 2.5}, "fit_steps=100"),
                                     ({"fit_lr": 0}, "fit_lr=0.002"), ({"fit_lr": float("nan")}, "fit_lr=0.002"),
                                     ({"keep": 0}, "keep=0.5"), ({"keep": 1.5}, "keep=0.5"),
                                     ({"fit_rank": 0}, "fit_rank=8"), ({"rounds": True}, "rounds=1")])
def test_bad_hyperparameters_are_one_line_errors(tiny, hp, fix):
    with pytest.raises(AttackError) as e:
        make_attack("vocab-match-fitted", model=tiny, defense="lora-private(rank=8,steps=100)", **hp)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"vocab-match-fitted {next(iter(hp))}=") and f"e.g. {fix}" in msg


def test_it_is_a_public_weights_recipe_labelled_shadow_under_private_layers():
    cls = get_attack_class("vocab-match-fitted")
    assert cls.threat_model == "white-box (exact)" and cls.adaptive and cls.scoring == "prefixes"
    assert knowledge_label(cls.threat_model, True) == "shadow"
    assert threat_label(cls.threat_model, DefensePipeline.parse(VICTIM), adaptive=True) == "shadow, adaptive"
    assert threat_label(cls.threat_model, DefensePipeline.parse("none"), adaptive=True) == "white-box (exact)"


def test_it_never_reads_the_plaintext_of_the_states_it_inverts(tiny, victim):
    """The fit's labels are the search's own guesses: the same states with their true tokens blanked out give the
    very same inversion (a k = 0 attacker, not ``paired``)."""
    train, test, _ = victim
    short = test.select_sequences([0, 1]).truncate(12)
    blank = Taps(np.asarray(short.hidden), np.zeros_like(short.token_ids), short.seq_lengths, short.seq_doc,
                 short.documents, short.offsets, short.meta)
    atk = make_attack("vocab-match-fitted", model=tiny, defense="lora-random(rank=4,scale=0.1)", fit_steps=5,
                      **FAST).fit(train)
    state = torch.random.get_rng_state()
    a, b = atk.invert(short, k=2), atk.invert(blank, k=2)
    assert torch.equal(torch.random.get_rng_state(), state)  # the adapter's seeded init leaves the caller's RNG
    assert a.info["adapter_fitted"] and np.array_equal(a.topk, b.topk) and np.array_equal(a.scores, b.scores)
    assert a.info["adapter_fit_loss"] == b.info["adapter_fit_loss"]


def test_the_scan_it_records_is_the_one_it_runs(tiny):
    """Under private layers the fitted search is vocab-match's greedy scan over ``max_candidates`` or the whole
    vocabulary, not the adaptive beam's capped list: at the default model's vocabulary and no cap given it was
    recorded as 1024 (the beam's ``capped_candidates``) where it scans all 49,152."""
    assert make_attack("vocab-match-fitted", model=tiny, defense=VICTIM).scan_cap(49152) is None
    assert make_attack("vocab-match-fitted", model=tiny, defense=VICTIM, max_candidates=256).scan_cap(49152) == 256
    assert make_attack("vocab-match-adaptive", model=tiny, defense=VICTIM).scan_cap(49152) == 1024  # the beam's
