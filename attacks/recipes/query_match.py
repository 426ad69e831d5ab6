"""The queries a token-sharded body's attention exchange hands to another party, matched (``query-match``).

Token sharding (Cascade, Thomas et al., "Cascade: Token-Sharded Private LLM Inference", ICML 2025, arXiv
2507.05228) keeps each position's hidden state on the body party that holds it. Attention at that position
needs the keys and values of every earlier position, which the other parties hold, so something crosses between
parties in every layer: in the cheapest exact exchange (the one
:func:`splitinfer.defenses.token_shard.cost_per_step` counts) the position's query goes out to the other
parties, and in Cascade its attention nodes receive query, key and value rows of shards they do not hold.
``shard-infill`` measures what a party recovers from the states of its own positions; this recipe measures what
a party recovers from the queries it receives.

What it sees: the first body layer's query rows, ``q = W_q RMSNorm(h)`` (then the query norm on families that
have one: per head on Gemma 3 and Qwen 3, over all heads on OLMo 2, which has no norm before), before the rotary
embedding. The rotation is the same known orthogonal map for every candidate at a position, and the receiving
party knows the position (it masks its keys causally by it), so it can undo it. Observed queries are rounded to
the victim's wire dtype, as they would be sent.

The search is :class:`AdaptiveVocabMatch`'s exact matching (undefended: left to right, the whole vocabulary
reachable, accepted at the match) in the query space: every candidate's head state goes through the same public
map (:meth:`observed_view`, through which the gradient-guided search descends too) and is compared with the
observed query, and the ridge proposer that orders the candidates is fitted on the queries of the attacker's own
training text and of random token sequences. The query map reads the whole state where ``W_q`` has full column
rank (the default model's first body layer at head depth 2 and 8: 576 x 576, rank 576; Gemma 3 270M's: 1024 x
640, rank 640), so the query fixes the normalised state and exact matching applies.

Threat model: white-box (exact): the public local layers and the first body layer's public weights (the party
runs that layer itself); never the state rows of positions it does not hold (:meth:`_observed` replaces the taps
by their queries before the search starts). Deviations: only the first body layer's queries are read (a party
receives queries at every body layer, and an attention node keys and values too: more, not less); undefended
states only (``defense`` must be ``none``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from attacks.defended import wire_dtype_of
from attacks.errors import AttackError
from attacks.recipes.vocab_match import match_distance
from attacks.recipes.vocab_match_adaptive import AdaptiveVocabMatch
from attacks.registry import register_attack
from attacks.tapdata import Taps


@register_attack("query-match")
class QueryMatch(AdaptiveVocabMatch):
    """White-box (exact): vocab-match on the first body layer's query rows that a sharded body's exchange sends."""

    # no defenses-stage row: run on undefended states by benchmarks.match_search (token sharding is not a
    # runtime defense; see splitinfer.defenses.token_shard)
    applies_to = ("token-shard",)

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        if self.defense.items:
            raise AttackError(f"query-match defense={self.hparams['defense']!r}: it reads the queries of undefended "
                              "states; give defense=none")
        self._states_like: Taps | None = None  # the training taps in state space (_random_taps needs their shape)
        self._depth = 0  # the observed taps' head depth: its first body layer is the one queried

    # ------------------------------------------------------------ the view
    def _layer(self, depth: int) -> torch.nn.Module:
        layers = self._need_model().model.model.layers
        if not 0 < depth < len(layers):
            raise AttackError(f"query-match: taps at depth {depth} leave no body layer to query; give head depths "
                              f"1 to {len(layers) - 1}")
        return layers[depth]

    def queries(self, hidden: torch.Tensor, depth: int) -> torch.Tensor:  # (N, d) -> (N, H * D_h)
        """The first body layer's query rows of head states ``hidden`` (before the rotary embedding)."""
        layer = self._layer(depth)
        att = getattr(layer, "self_attn", None)
        if not isinstance(getattr(att, "q_proj", None), torch.nn.Linear):
            raise AttackError(f"query-match reads a layer's q_proj; {type(att).__name__} has another query layout "
                              "(fused or low-rank projections): use a family with a plain q_proj (Llama, Gemma, Qwen)")
        param = att.q_proj.weight
        x = hidden.to(param.device, param.dtype)  # (N, d)
        pre = getattr(layer, "input_layernorm", None)  # absent where the norms come after (OLMo 2)
        q = att.q_proj(pre(x) if pre is not None else x)  # (N, H * D_h)
        norm = getattr(att, "q_norm", None)
        if norm is not None and norm.weight.numel() == q.shape[-1]:  # OLMo 2: one norm over all heads
            q = norm(q)
        elif norm is not None:  # Gemma 3, Qwen 3: RMSNorm per head, over the head dimension
            q = norm(q.view(q.shape[0], -1, norm.weight.numel())).reshape(q.shape[0], -1)
        return q

    @torch.no_grad()
    def _view(self, taps: Taps, wire: torch.dtype | None = None) -> Taps:
        """``taps`` with every state replaced by its query row (rounded to ``wire`` as it would be sent)."""
        depth = int(taps.meta.get("depth") or 0)
        rows = []
        for a in range(0, taps.n_tokens, 4096):
            h = torch.from_numpy(np.asarray(taps.hidden[a:a + 4096], dtype=np.float32))  # (n, d)
            q = self.queries(h, depth)
            rows.append((q.to(wire) if wire is not None else q).float().cpu().numpy())
        hidden = np.concatenate(rows) if rows else np.zeros((0, 1), np.float32)
        return Taps(hidden, taps.token_ids, taps.seq_lengths, taps.seq_doc, taps.documents, taps.offsets,
                    {**taps.meta, "view": "query"})

    # ------------------------------------------------------------ fit / inversion in the query space
    def _fit(self, train: Taps, val: Taps | None, trainer: Any) -> None:
        self._states_like = train
        super()._fit(self._view(train), self._view(val) if val is not None else None, trainer)

    def _random_taps(self, like: Taps, n_tokens: int, length: int = 64) -> Taps:
        states = super()._random_taps(self._states_like if self._states_like is not None else like, n_tokens, length)
        return self._view(states)

    def _observed(self, taps: Taps) -> Taps:
        self._depth = int(taps.meta.get("depth") or 0)
        return self._view(taps, wire_dtype_of(taps))  # as the victim's wire rounds what it sends

    def observed_view(self, h: torch.Tensor) -> torch.Tensor:  # (B, d) -> (B, H * D_h)
        return self.queries(h, self._depth).to(h.device, h.dtype)

    def distance(self, h: torch.Tensor, obs: torch.Tensor, t: int | None = None) -> torch.Tensor:
        """(B, d) candidate head states, (H * D_h,) observed query -> (B,) distance of the candidates' queries."""
        return match_distance(self.observed_view(h), obs)
