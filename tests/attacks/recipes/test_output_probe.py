"""output-probe: next / current targets at the body-tail boundary."""

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
    """'next' reads the token generated from each state (t+1), 'current' the token the body received (t)."""
    train, test = tail_taps(0), tail_taps(1)
    nxt = make_attack("output-probe", epochs=10, batch_size=32, lr=0.01).fit(train, tail_taps(2))
    cur = make_attack("output-probe", epochs=10, batch_size=32, lr=0.01, target="current").fit(train, tail_taps(2))
    assert (nxt.reads, cur.reads) == ("next", "current")
    has_next = test.next_token_ids() >= 0
    acc_next = float((nxt.invert(test).tokens == test.next_token_ids())[has_next].mean())
    assert acc_next > 3 / 30 and accuracy(cur.invert(test), test) > 3 / 30
    again = load_attack(nxt.save(tmp_path / "op"))
    assert again.reads == "next" and np.array_equal(again.invert(test).topk, nxt.invert(test).topk)


def test_output_probe_next_position_alignment() -> None:
    """With states carrying the next token, the guess at row t is token t+1 (no argument to invert)."""
    train = make_taps(n_seqs=60, seq_len=10, vocab=30, d=32, noise=0.1, seed=0, boundary="tail:2", next_weight=1.0)
    attack = make_attack("output-probe", epochs=10, batch_size=32, lr=0.01).fit(train)
    test = make_taps(n_seqs=30, seq_len=10, vocab=30, d=32, noise=0.1, seed=1, boundary="tail:2", next_weight=1.0)
    inv = attack.invert(test)
    nxt = test.next_token_ids()
    assert float((inv.tokens == nxt)[nxt >= 0].mean()) > 0.9


def test_output_probe_rejects_head_taps_and_bad_target() -> None:
    attack = make_attack("output-probe", epochs=1).fit(tail_taps(0))
    with pytest.raises(AttackError, match="tail boundary"):
        attack.invert(make_taps(boundary="head:2", d=32))
    with pytest.raises(AttackError, match="target='both'"):  # removed: it equalled 'current'
        make_attack("output-probe", target="both")
    with pytest.raises(TypeError):  # regression (issue 17 item 6): invert takes no extra argument
        attack.invert(tail_taps(1), target="next")
