"""The seed's MLP decoder under the proper protocol and the seed's (about 880 pairs, random token-level split)."""

from __future__ import annotations

import numpy as np

from attacks.registry import load_attack, make_attack
from tests.attacks.synth import accuracy, make_taps

SMALL = {"width": 64, "epochs": 6, "batch_size": 32}


def test_mlp_proper_beats_uniform_and_round_trips(tmp_path) -> None:
    train, test = make_taps(seed=0), make_taps(seed=1, first_doc=100)
    attack = make_attack("mlp", **SMALL).fit(train, make_taps(seed=2))
    inv = attack.invert(test)
    assert accuracy(inv, test) > 0.8 and attack.fit_report["protocol"] == "proper"
    again = load_attack(attack.save(tmp_path / "mlp"))
    assert again.hparams["width"] == 64 and np.array_equal(again.invert(test).topk, inv.topk)


def test_mlp_seed_protocol_uses_880_pairs_and_reports_its_own_split() -> None:
    train = make_taps(n_seqs=100, seed=0)  # 1200 tokens
    attack = make_attack("mlp", protocol="seed", seed_epochs=15, width=64, batch_size=32).fit(train)
    rep = attack.fit_report
    assert rep["protocol"] == "seed" and rep["seed_pairs"] == 880
    assert rep["seed_test_pairs"] == 176 and rep["seed_train_pairs"] == 704
    assert 0.0 <= rep["seed_split_top1"] <= rep["seed_split_top5"] <= 1.0 and rep["seed_split_top1"] > 0.5
    assert attack.hparams["epochs"] == 6  # the seed's epoch count does not leak into the saved config
    assert accuracy(attack.invert(make_taps(seed=1)), make_taps(seed=1)) > 1 / 40
