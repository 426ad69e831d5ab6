"""vocab-match-aligned: permute's signed basis recovered from released states alone, without the body weights."""

from __future__ import annotations

import pytest
import torch

from attacks.defended import applies, attacker_view, defend_taps, show_cloud, show_traffic
from attacks.errors import AttackError
from attacks.public import public_mask
from attacks.registry import get_attack_class, make_attack
from attacks.tapdata import Taps
from splitinfer.defenses import DefensePipeline
from tests.attacks.recipes.test_vocab_match_adaptive import taps  # noqa: F401 - the module's tap fixture


def _fitted(tiny, taps, mode: str, **hp):  # noqa: F811
    pipe = DefensePipeline.parse(f"permute(mode={mode},seed=3)")
    atk = make_attack("vocab-match-aligned", model=tiny, defense=f"permute(mode={mode})", proposer_tokens=2000,
                      random_tokens=512, beam=1, **hp).fit(defend_taps(taps, attacker_view(pipe)))  # its own basis
    return pipe, atk


def test_the_signed_basis_comes_from_the_traffic_without_the_weights(tiny, taps):  # noqa: F811
    pipe, atk = _fitted(tiny, taps, "signed")
    show_cloud(atk, tiny, pipe, 2)  # offered the transformed weights: it does not use them
    assert atk.fit_report["cloud_weights_offered_and_ignored"]
    show_traffic(atk, lambda: defend_taps(taps, pipe))  # every session the deployment served
    test = defend_taps(taps.select_sequences(range(3)), pipe)
    inv = atk.invert(test, k=1)
    assert torch.equal(atk.basis, pipe.get("permute").matrix(tiny.hidden_size))
    assert atk.fit_report["alignment_converged"]
    assert float((inv.tokens == test.token_ids).mean()) == 1.0


def test_without_traffic_and_with_a_rotation_it_says_it_did_not_converge(tiny, taps):  # noqa: F811
    """Three short sequences cannot pin a rotation of d = 64: it must not claim an exact basis and match as if it
    had one (every position is beam-searched instead, under the elementwise-relative likelihood)."""
    pipe, atk = _fitted(tiny, taps, "rotation")
    test = defend_taps(taps.select_sequences(range(3)), pipe)
    inv = atk.invert(test, k=1)
    assert not atk.fit_report["alignment_converged"] and inv.info["search"] == "beam"


def _with_public_lead(taps, chars: int):
    """The same taps with each document's first ``chars`` characters marked as template (public) text."""
    docs = [{**doc, "template_spans": [{"start": 0, "end": chars}]} for doc in taps.documents]
    return Taps(taps.hidden, taps.token_ids, taps.seq_lengths, taps.seq_doc, docs, taps.offsets, taps.meta)


def test_a_rotation_is_read_from_inner_products_without_the_weights(tiny, taps):  # noqa: F811
    """Inner products survive any orthogonal Q: from the sessions' public leads the attacker decodes rows without
    Q, until its pairs span R^d; Procrustes on them is Q to wire precision, and every token is recovered. The
    statistics' start (``init=statistics``) does not converge on the same traffic."""
    lead = _with_public_lead(taps, 8)
    assert public_mask(lead).sum() >= 8 * len(lead.seq_lengths) - 8
    pipe, atk = _fitted(tiny, lead, "rotation")
    show_traffic(atk, lambda: defend_taps(lead, pipe))
    test = defend_taps(lead.select_sequences(range(3)), pipe)
    inv = atk.invert(test, k=1)
    rep = atk.fit_report
    assert rep["init"] == "gram" and rep["gram_spans"] and rep["alignment_converged"], rep
    assert rep["gram_decoded"] > 0 and rep["gram_rows"] == 2 * tiny.hidden_size
    true_q = pipe.get("permute").matrix(tiny.hidden_size).double()
    assert float((atk.basis - true_q).abs().max()) < 1e-2
    assert float((inv.tokens == test.token_ids).mean()) == 1.0


def test_a_bad_start_is_refused(tiny):
    with pytest.raises(AttackError, match="init="):
        make_attack("vocab-match-aligned", model=tiny, defense="permute(mode=rotation)", init="eigen")


def test_it_runs_only_against_permute(tiny):
    cls = get_attack_class("vocab-match-aligned")
    assert applies(cls, DefensePipeline.parse("permute(mode=rotation)"))
    assert not applies(cls, DefensePipeline.parse("noise(sigma=0.1,clip=3.0)"))
    with pytest.raises(AttackError, match="made for permute"):
        make_attack("vocab-match-aligned", model=tiny, defense="noise(sigma=0.1,clip=3.0)")


def test_the_defenses_stage_hands_it_the_traffic(tiny, taps):  # noqa: F811
    """The stage's attacker call gives vocab-match-aligned the victim's released states of the whole test pool
    (``traffic``) and records whether the alignment converged; without the traffic three sequences are too few."""
    from benchmarks.stage_defenses import _attack

    pipe = DefensePipeline.parse("permute(mode=signed,seed=3)")
    clean = taps.select_sequences(range(3))
    opts = {"proposer_tokens": 2000, "random_tokens": 512, "beam": 1}
    rows = _attack(tiny, "vocab-match-aligned", opts, pipe, taps, defend_taps(clean, pipe), 0, "r", {}, n_boot=50,
                   clean=clean, traffic=taps)
    assert rows[0]["alignment_converged"] and rows[0]["metrics"]["token_acc_top1"]["value"] == 1.0
    alone = _attack(tiny, "vocab-match-aligned", opts, pipe, taps, defend_taps(clean, pipe), 0, "r", {}, n_boot=50,
                    clean=clean)
    assert not alone[0]["alignment_converged"]
