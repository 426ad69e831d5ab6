"""The position-conditioned prior, its use for exact match and PII, lift and coverage (issue 14 items 3 and 7)."""

from __future__ import annotations

import numpy as np
import pytest

from attacks import metrics as M

# training: every sequence starts with the same 3-token "template" 7 8 9, then free text
TRAIN = np.array([7, 8, 9, 1, 2, 7, 8, 9, 3, 1, 7, 8, 9, 1, 4])
TRAIN_POS = np.array([0, 1, 2, 3, 4] * 3)


def test_position_prior_guesses_the_most_frequent_token_at_each_position() -> None:
    prior = M.TokenPrior.fit(TRAIN, TRAIN_POS, k=2)
    assert prior.unigram.tolist() == [1, 7]  # 1, 7, 8 and 9 appear 3 times each: smaller ids first
    assert prior.by_position[:3, 0].tolist() == [7, 8, 9]
    assert prior.position_guesses([0, 1, 2, 3, 9])[:, 0].tolist() == [7, 8, 9, 1, 1]  # past the table: unigram
    assert M.TokenPrior.fit(TRAIN, None).has_positions is False
    with pytest.raises(ValueError, match="one per token"):
        M.TokenPrior.fit(TRAIN, TRAIN_POS[:3])


def test_position_baseline_exact_match_pii_and_lift() -> None:
    prior = M.TokenPrior.fit(TRAIN, TRAIN_POS, k=1)
    test = [np.array([7, 8, 9, 1]), np.array([7, 8, 9, 5])]
    positions = [np.arange(4), np.arange(4)]
    attack = [t.copy()[:, None] for t in test]
    attack[1][3, 0] = 0  # the attack misses one token
    offsets = [np.array([[0, 1], [1, 2], [2, 3], [3, 4]])] * 2
    spans = [[{"start": 3, "end": 4, "type": "name"}]] * 2
    out = M.summarize(test, attack, ks=(1,), prior=prior, positions=positions, offsets=offsets, spans=spans,
                      n_boot=50)
    assert out["baseline_position_top1"]["value"] == pytest.approx(7 / 8)
    assert out["baseline_unigram_top1"]["value"] == pytest.approx(1 / 8)  # always id 1
    assert out["baseline_position_exact_match"]["value"] == 0.5
    assert out["baseline_position_pii_recovery_name"]["value"] == 0.5
    assert out["token_acc_top1"]["value"] == pytest.approx(7 / 8)
    assert out["lift_token_acc_top1"]["value"] == pytest.approx(0.0)  # no better than the position prior
    assert out["lift_exact_match"]["value"] == pytest.approx(0.0)
    assert out["coverage"]["value"] == pytest.approx(7 / 8)  # id 5 never occurs in training


def test_template_tokens_are_scored_apart_from_user_text() -> None:
    prior = M.TokenPrior.fit(TRAIN, TRAIN_POS, k=1)
    test = [np.array([7, 8, 9, 4, 2]), np.array([7, 8, 9, 1, 3])]
    guess = [prior.position_guesses(np.arange(5))[:, :1] for _ in test]  # an "attack" that only knows positions
    mask = [np.array([True, True, True, False, False])] * 2
    out = M.summarize(test, guess, ks=(1,), prior=prior, positions=[np.arange(5)] * 2, template_mask=mask,
                      n_boot=50)
    assert out["template_token_acc_top1"]["value"] == 1.0 and out["template_token_acc_top1"]["n"] == 6
    assert out["token_acc_top1"]["value"] == pytest.approx(1 / 4) and out["token_acc_top1"]["n"] == 4
    all_tokens = M.summarize(test, guess, ks=(1,), n_boot=50)["token_acc_top1"]["value"]
    assert all_tokens == pytest.approx(7 / 10)  # what counting the template as recovered text reported
    assert out["template_baseline_position_top1"]["value"] == 1.0
    with pytest.raises(ValueError, match="no user text"):
        M.summarize(test, guess, template_mask=[np.ones(5, bool)] * 2)
