"""Token sharding across non-colluding bodies, attacked by one of them (``shard-infill``).

Cascade (Thomas et al., "Cascade: Token-Sharded Private LLM Inference", ICML 2025, arXiv 2507.05228) deals a
prompt's positions out to several body parties that do not collude: each sees the hidden states of its own
positions only, every other one several positions away, and the parties together compute the unsplit body.
Its argument against vocabulary matching: a position's state depends on every earlier token, so a party that
sees position j but not the g positions before it must try every filling of the gap, V^g prefixes.

This recipe is the party's attack with the public model as a prior over the gaps. Positions are dealt
round-robin (``t % shards == party``: the party sees one position in ``shards``, gaps of ``shards - 1``). The
search is :class:`AdaptiveVocabMatch`'s beam over positions (:func:`attacks.recipes._match_beam.beam_match`)
with the public model as prior (weight ``lam``): at a position the party sees, the proposer's first
``max_candidates`` tokens are scored by how well each reproduces the observed state under the beam's prefix
(elementwise relative error, Gaussian with scale ``match_tau``), so a wrong gap filling costs at the next seen
position; at a position it does not see, the beam extends every prefix by the prior's ``lm_top`` likeliest
tokens, scored by the prior alone. So the gap is searched only where the public model puts its mass, not over
V^g prefixes; natural text is where that pays.

Threat model: white-box (exact), adaptive: the public local layers and the sharding scheme (which positions
this party holds), never the other parties' states. The party's states are otherwise undefended; there is
no defenses-stage row for it (``benchmarks.match_search`` runs it on undefended states), and it hides every
row it does not hold from itself before it starts (:meth:`_invert`), so nothing it computes can read them.
Positions after the last one it sees have only the prior. Colluding parties see every row: that is the
undefended matcher (``vocab-match-adaptive``, 100% on the default model).

Deviations from Cascade: only the states at the split's head depth are used (a party also sees its positions'
states at every later body layer, and an attention party sees query, key and value rows of other shards:
more, not less, than this attack reads; ``query-match`` reads the queries); sharding is round-robin rather than
the paper's schemes; the serving runtime does not run sharded bodies
(:func:`splitinfer.defenses.token_shard.cost_per_step` gives what a sharded step would cost in round trips and
bytes).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attacks.errors import AttackError
from attacks.recipes._beam import CausalLMPrior
from attacks.recipes.vocab_match_adaptive import AdaptiveVocabMatch
from attacks.registry import register_attack
from attacks.tapdata import Taps
from splitinfer.defenses.token_shard import party_of


@register_attack("shard-infill")
class ShardInfill(AdaptiveVocabMatch):
    """White-box (exact), adaptive: one body party of a token-sharded split, filling its gaps with the public LM."""

    # no defenses-stage row: run on undefended states by benchmarks.match_search, its view set by shards and party
    applies_to = ("token-shard",)
    requires = frozenset({"head_weights", "language_model"})
    defaults = {**AdaptiveVocabMatch.defaults, "shards": 2, "party": 0, "lam": 1.0, "lm_top": 32, "beam": 16,
                "max_candidates": 256}

    never_exact = True  # no exact match through a gap the party cannot see: always the beam, capped as asked

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        shards = self.require_int("shards", 2)
        self.require_int("lm_top")
        if self.require_int("party", 0) >= shards:
            raise AttackError(f"shard-infill party={self.hparams['party']!r}; give an integer in [0, shards - 1]")
        self.require_number("lam", 0, " (the prior's weight)")

    def hidden(self, t: int) -> bool:
        return party_of(t, int(self.hparams["shards"])) != int(self.hparams["party"])

    def visible_rows(self, taps: Taps) -> np.ndarray:
        """(N,) bool: the taps' rows this party sees."""
        return party_of(np.asarray(taps.positions()), int(self.hparams["shards"])) == int(self.hparams["party"])

    def language_prior(self) -> tuple[Any, float]:
        return CausalLMPrior.for_text(self._need_model()), float(self.hparams["lam"])

    def _invert(self, taps: Taps, k: int):
        seen = self.visible_rows(taps)
        masked = np.where(seen[:, None], np.asarray(taps.hidden, dtype=np.float32), np.float32(0))  # (N, d)
        view = Taps(masked, taps.token_ids, taps.seq_lengths, taps.seq_doc, taps.documents, taps.offsets, taps.meta)
        inv = self._beam_invert(view, k)
        inv.info.update({"shards": int(self.hparams["shards"]), "party": int(self.hparams["party"]),
                         "rows_seen": int(seen.sum()), "rows": int(len(seen))})
        return inv
