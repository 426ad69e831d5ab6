"""benchmarks.match_search: an attacker that sees only some positions is scored on them and on the rest apart."""

from __future__ import annotations

import numpy as np

from attacks.base import Inversion
from benchmarks.match_search import _seen_apart
from tests.attacks.recipes._tiny_taps import tiny_head_taps


class _EveryOther:
    """A stand-in attacker that holds the even positions of every sequence."""

    def visible_rows(self, taps):
        return taps.positions() % 2 == 0


def test_seen_and_unseen_positions_are_scored_apart(tiny, tmp_path):
    taps = tiny_head_taps(tiny, tmp_path).select_sequences([0, 1]).truncate(6)
    seen = _EveryOther().visible_rows(taps)
    guess = np.where(seen, taps.token_ids, (taps.token_ids + 1) % 250)  # right where seen, wrong elsewhere
    inv = Inversion(guess, guess[:, None], np.zeros((len(guess), 1), np.float32), {})
    out = _seen_apart(_EveryOther(), inv, taps, int(tiny.config.vocab_size))
    assert out["top1_seen"] == 1.0 and out["top1_unseen"] == 0.0
    assert out["n_seen"] + out["n_unseen"] <= len(guess) and out["n_seen"] > 0
    assert _seen_apart(object(), inv, taps, 259) == {}  # an attacker that sees everything adds nothing
