"""linear-probe (softmax) and linear-embed (ridge into the embedding space, nearest-neighbour decoding)."""

from __future__ import annotations

import numpy as np
import pytest

from attacks.errors import AttackError
from attacks.registry import load_attack, make_attack
from tests.attacks.synth import accuracy, embedding_taps, make_taps


def test_linear_probe_beats_uniform_and_round_trips(tmp_path) -> None:
    train, test = make_taps(seed=0), make_taps(seed=1, first_doc=100)
    attack = make_attack("linear-probe", epochs=10, batch_size=32, lr=0.01).fit(train, make_taps(seed=2))
    inv = attack.invert(test)
    assert accuracy(inv, test) > 0.9
    assert attack.fit_report["restricted_vocab"] == 40 and attack.fit_report["best_val"] > 0.8
    again = load_attack(attack.save(tmp_path / "lp"))
    assert np.array_equal(again.invert(test).topk, inv.topk)


def test_linear_embed_recovers_tokens_never_seen_in_training(tiny, tmp_path) -> None:
    rng = np.random.default_rng(0)
    train = embedding_taps(tiny, rng.integers(0, 200, 2000), seed=0)  # tokens 0..199 only
    test = embedding_taps(tiny, rng.integers(200, 259, 300), seed=1)  # tokens never seen
    attack = make_attack("linear-embed", model=tiny).fit(train)
    assert attack.fit_report["metric"] in ("cosine", "l2") and attack.fit_report["alpha"] in attack.hparams["alphas"]
    inv = attack.invert(test)
    assert accuracy(inv, test) > 0.9
    path = attack.save(tmp_path / "le")
    assert np.array_equal(load_attack(path, model=tiny).invert(test).topk, inv.topk)
    with pytest.raises(AttackError, match="needs embedding"):
        load_attack(path).invert(test)


def test_linear_embed_bad_metric() -> None:
    with pytest.raises(AttackError, match="metric"):
        make_attack("linear-embed", metric="manhattan")


def test_embedding_backoff_names_tokens_never_seen_in_training(tiny, tmp_path) -> None:
    rng = np.random.default_rng(1)
    common = rng.integers(0, 100, 3000)
    rare = rng.integers(100, 259, 40)  # each seen about once: trains the <unk> class
    train = embedding_taps(tiny, np.concatenate([common[:2960], rare]), seed=0)
    val = embedding_taps(tiny, np.concatenate([rng.integers(0, 100, 150), rng.integers(100, 259, 50)]), seed=2)
    test = embedding_taps(tiny, np.concatenate([rng.integers(0, 100, 200), rng.integers(150, 259, 100)]), seed=3)
    plain = make_attack("linear-probe", epochs=10, batch_size=64, lr=0.01, backoff="none").fit(train, val)
    backed = make_attack("linear-probe", model=tiny, epochs=10, batch_size=64, lr=0.01).fit(train, val)
    assert backed.fit_report["backoff"] == "embed" and plain.fit_report["backoff"] == "none"
    unseen = ~np.isin(test.token_ids, np.unique(train.token_ids))
    inv = backed.invert(test)
    assert (inv.tokens == test.token_ids)[unseen].mean() > 0.5
    assert (plain.invert(test).tokens == test.token_ids)[unseen].mean() == 0.0
    path = backed.save(tmp_path / "lpb")
    assert np.array_equal(load_attack(path, model=tiny).invert(test).topk, inv.topk)
    with pytest.raises(AttackError, match="embedding backoff"):
        load_attack(path)


def _victim(taps, shift: int):
    """The victim's states: the same tokens through changed local layers (here the first 16 dimensions rolled)."""
    import dataclasses

    hidden = taps.hidden.copy()
    hidden[:, :16] = np.roll(hidden[:, :16], shift, axis=1)
    return dataclasses.replace(taps, hidden=hidden)


def test_paired_fine_tune_keeps_the_public_weights_when_the_pairs_do_not_help() -> None:
    """Regression: unvalidated fine-tuning on few, noisy pairs made the paired attacker worse than the one
    without pairs (here 100% -> 88%; full suite, lora-private: 95.0% at k = 0, 89.9% at k = 10,000)."""
    import dataclasses

    train, test = make_taps(seed=0), make_taps(seed=1, first_doc=100)
    attack = make_attack("linear-probe", epochs=10, batch_size=32, lr=0.01).fit(train)
    before = attack.invert(test).topk
    pairs = make_taps(seed=5, n_seqs=10, first_doc=300)  # 120 pairs of the same victim, 30% of them mislabelled
    rng = np.random.default_rng(1)
    ids, wrong = pairs.token_ids.copy(), rng.random(pairs.n_tokens) < 0.3
    ids[wrong] = rng.integers(0, 40, int(wrong.sum()))
    assert attack.fine_tune(dataclasses.replace(pairs, token_ids=ids)) > 0
    assert attack.fit_report["paired_kept_public"] and np.array_equal(attack.invert(test).topk, before)


def test_paired_fine_tune_learns_a_changed_victim() -> None:
    train, test = make_taps(seed=0), _victim(make_taps(seed=1, first_doc=100), 3)
    attack = make_attack("linear-probe", epochs=10, batch_size=32, lr=0.01).fit(train)
    shadow = accuracy(attack.invert(test), test)
    attack.fine_tune(_victim(make_taps(seed=4, n_seqs=60, first_doc=300), 3))
    assert not attack.fit_report["paired_kept_public"]
    assert accuracy(attack.invert(test), test) > shadow + 0.05


def test_paired_fine_tune_on_no_usable_pair_does_not_report_the_previous_ks_choice() -> None:
    """Regression: fine_tune returned 0 (no pair inside the classifier's vocabulary) without touching fit_report,
    so a row kept the previous k's ``paired_kept_public``."""
    import dataclasses

    train = make_taps(seed=0)
    attack = make_attack("linear-probe", epochs=10, batch_size=32, lr=0.01, backoff="none").fit(train)
    pairs = make_taps(seed=5, n_seqs=10, first_doc=300)
    rng = np.random.default_rng(1)
    ids, wrong = pairs.token_ids.copy(), rng.random(pairs.n_tokens) < 0.3  # noisy pairs: the public fit is kept
    ids[wrong] = rng.integers(0, 40, int(wrong.sum()))
    assert attack.fine_tune(dataclasses.replace(pairs, token_ids=ids)) > 0 and attack.fit_report["paired_kept_public"]
    unseen = dataclasses.replace(pairs, token_ids=np.full_like(pairs.token_ids, 10_000))  # outside the vocabulary
    assert attack.fine_tune(unseen) == 0
    assert attack.fit_report["paired_kept_public"] is False and attack.fit_report["paired_pairs"] == 0
