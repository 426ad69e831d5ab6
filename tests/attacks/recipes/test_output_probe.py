"""output-probe: next / current / both targets at the body-tail boundary."""

from __future__ import annotations

import numpy as np
import pytest

from attacks.errors import AttackError
from attacks.registry import load_attack, make_attack
from tests.attacks.synth import accuracy, make_taps


def tail_taps(seed: int):
    """State at t = table[token t] + table2[token t+1] + noise (current and next token, like a body output)."""
    return make_taps(n_seqs=60, seq_len=10, vocab=30, d=32, noise=0.6, seed=seed, boundary="tail:2", next_weight=1.0,
                     first_doc=100 * seed)


def test_output_probe_targets(tmp_path) -> None:
    train, test = tail_taps(0), tail_taps(1)
    attack = make_attack("output-probe", epochs=10, batch_size=32, lr=0.01).fit(train, tail_taps(2))
    acc = {t: accuracy(attack.invert(test, target=t), test) for t in ("current", "next", "both")}
    assert all(a > 3 / 30 for a in acc.values())
    assert acc["both"] >= max(acc["current"], acc["next"]) - 0.02
    inv = attack.invert(test, target="next")
    assert inv.info["target"] == "next" and inv.info["first_position_fallbacks"] == len(test)
    assert attack.invert(test, target="current").info["first_position_fallbacks"] == 0
    again = load_attack(attack.save(tmp_path / "op"))
    assert np.array_equal(again.invert(test, target="both").topk, attack.invert(test, target="both").topk)


def test_output_probe_next_position_alignment() -> None:
    """With states carrying the next token, 'next' guesses token t from the state at t-1."""
    train = make_taps(n_seqs=60, seq_len=10, vocab=30, d=32, noise=0.1, seed=0, boundary="tail:2", next_weight=1.0)
    attack = make_attack("output-probe", epochs=10, batch_size=32, lr=0.01).fit(train)
    test = make_taps(n_seqs=30, seq_len=10, vocab=30, d=32, noise=0.1, seed=1, boundary="tail:2", next_weight=1.0)
    inv = attack.invert(test, target="next")
    later = test.positions() > 0
    assert float((inv.tokens == test.token_ids)[later].mean()) > 0.9


def test_output_probe_rejects_head_taps_and_bad_target() -> None:
    attack = make_attack("output-probe", epochs=1).fit(tail_taps(0))
    with pytest.raises(AttackError, match="tail boundary"):
        attack.invert(make_taps(boundary="head:2", d=32))
    with pytest.raises(AttackError, match="target='previous'"):
        attack.invert(tail_taps(1), target="previous")
