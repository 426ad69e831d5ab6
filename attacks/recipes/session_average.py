"""Averaging across sessions (``session-average``): the same text sent r times with fresh noise draws.

Noise drawn afresh per session (:mod:`splitinfer.defenses.keyed`: the key holds the session) averages out
when the cloud sees the same text again: the mean of r releases ``clip(h) + n_i`` is ``clip(h)`` plus noise
of covariance ``Sigma / r``, i.e. the noise's std falls by ``sqrt(r)`` (:func:`average_sessions`). The
attacker then runs :class:`~attacks.recipes.vocab_match_whitened.WhitenedVocabMatch` on the mean, its
likelihood scaled to the reduced covariance. Composition theorems for differential privacy say the same
thing from the other side: r releases of one vector spend r times the budget.

Deployments that resend text: a fixed system prompt (every session of every user of an application), the
history a multi-turn chat resends in each new session (every earlier turn, once per later session), retrieval
or document question answering where the same document is asked about twice, agent loops that replay a
scratchpad, and client retries after a dropped connection. Within one session the draws are keyed by
position and content, so resending inside a session gives the same draw and averages nothing; a new session
draws afresh.

Fitting to the repeats (:meth:`SessionAverage.fit_sessions`): the attacker simulates the defense on its own
training text r times with its own draws and fits on the mean, so its candidate proposer and its noise
covariance are those of an r-session average, the distribution it then inverts. Fitted on single releases
(plain ``fit``), the proposer ranks candidates for noise sqrt(r) times larger than what it sees, and under a
candidate cap the true token can fall outside the list: recovery then flattens in r below what the lower
noise allows (the first committed resend sweep, `reports/resend/`, was fitted so).

Linking the repeats: the attacker is told which sessions carry the same text (same account and same prefix
length: what a provider's logs show); :meth:`SessionAverage.invert_sessions` takes them as a list of taps
with the same token layout. Deviations: no linking attack is run (states of a resent prefix differ only by
the noise, so nearest-neighbour linking is easy at any sigma measured here, but it is not measured); repeats
are whole resent sequences, not partial overlaps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attacks.base import Inversion
from attacks.errors import AttackError
from attacks.recipes.vocab_match_whitened import WhitenedVocabMatch
from attacks.registry import register_attack
from attacks.tapdata import Taps


def average_sessions(sessions: list[Taps]) -> Taps:
    """The mean of r sessions' states of the same token sequences: (N, d) each -> (N, d)."""
    if not sessions:
        raise AttackError("session-average needs at least one session's taps")
    first = sessions[0]
    for s in sessions[1:]:
        if s.hidden.shape != first.hidden.shape or not np.array_equal(s.seq_lengths, first.seq_lengths):
            raise AttackError(f"session-average: sessions differ in layout ({s.hidden.shape} vs "
                              f"{first.hidden.shape}); pass repeats of the same sequences")
    mean = np.mean([np.asarray(s.hidden, dtype=np.float64) for s in sessions], axis=0).astype(np.float32)
    return Taps(mean, first.token_ids, first.seq_lengths, first.seq_doc, first.documents, first.offsets,
                {**first.meta, "sessions_averaged": len(sessions)})


@register_attack("session-average")
class SessionAverage(WhitenedVocabMatch):
    """White-box (exact), adaptive: whitened matching on the mean of r sessions' releases of the same text."""

    defaults = {**WhitenedVocabMatch.defaults, "repeats": 4}

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.require_int("repeats", 1, " (sessions resending the text)")
        self.repeats_seen = 1
        self.fit_repeats = 1  # sessions averaged in the releases the attacker was fitted on

    def fit_sessions(self, sessions: list[Taps], val: Taps | None = None) -> "SessionAverage":
        """Fit on the mean of ``sessions`` (the attacker's own simulated releases of its training text, r fresh
        sessions): proposer and noise covariance then match an r-session average."""
        self.fit(average_sessions(sessions), val)
        self.fit_repeats = len(sessions)
        self.fit_report["sessions_averaged"] = len(sessions)
        return self

    def invert_sessions(self, sessions: list[Taps], k: int = 5) -> Inversion:
        """Invert the mean of ``sessions`` (the same sequences, each from a fresh session)."""
        self.repeats_seen = len(sessions)
        try:
            inv = self.invert(average_sessions(sessions), k)
        finally:
            self.repeats_seen = 1
        inv.info["repeats"] = len(sessions)
        return inv

    def log_likelihood(self, h, obs, t=None):  # (B, d), (d,) -> (B,): the mean's covariance is Sigma / r
        # the fitted covariance is that of a fit_repeats-session mean: rescale it to repeats_seen sessions
        return (self.repeats_seen / self.fit_repeats) * super().log_likelihood(h, obs, t)
