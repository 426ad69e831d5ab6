"""Several sessions' body steps as ONE forward of the body layers: packing with a block-diagonal mask.

Continuous batching in LLM servers (Yu et al., "Orca: A Distributed Serving
System for Transformer-Based Generative Models", OSDI 2022) runs the
requests that are ready as one batch at every step, however far along each
one is. Orca's *selective batching* flattens the requests' tokens into one
sequence for the token-wise operations (linear layers, norms, MLP) and splits
them for attention. This module does the same on the stock decoder layers:

- the sessions' new rows are concatenated into one sequence ``(1, sum T_i, d)``
  with their own absolute positions (so rotary embeddings are each session's);
- :class:`PackedCaches` is the cache object the attention modules see: its
  ``update`` splits the new keys/values per session, appends each part to that
  session's own :class:`~splitinfer.kv_cache.PartKVCache` and returns the
  sessions' full keys/values side by side, ``[cache_1, new_1, cache_2, new_2, ...]``;
- the attention mask is block-diagonal over that layout: session i's rows see
  only session i's block, inside which they get exactly the mask an unbatched
  forward would build (causal chain, token tree from ``parents``, sliding
  window), so nothing leaks between sessions.

Why packing and not padding (transformers' per-row ``attention_mask`` and
``position_ids`` over a padded ``DynamicCache``): the sessions keep their own
caches (their ``keep`` / ``crop`` edits and ``--max-context`` checks stay per
session), no linear-layer compute is spent on padding rows when one session
sends a 30-node draft tree and another a single token, and with the
batch-invariant kernels (:mod:`splitinfer.batch_invariant`) a row's result is
bit-identical to its unbatched forward: each query row attends alone to
exactly its allowed keys gathered in cache order, and the padded linear layers
are row-invariant up to :data:`~splitinfer.batch_invariant.MAX_ROWS` rows
(the scheduler never packs more). Deviations: attention is computed over the
whole packed key block and masked, so its cost grows with the number of
sessions times their total length (Orca splits the requests for attention
instead); with the default kernels the masked attention over a longer key
block and the matrix products over more rows round differently, so states
differ from the unbatched ones by float32 noise (greedy tokens agree; see
``docs/server.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from splitinfer.kv_cache import PartKVCache, attention_mask
from splitinfer.partition import LayerStack


@dataclass
class BodyStep:
    """One session's body forward: what ``CloudBody.forward`` takes."""

    hidden: torch.Tensor  # (1, T, d) on the body's device and dtype
    positions: torch.Tensor  # (T,) long
    cache: PartKVCache
    parents: Sequence[int] | None = None

    @property
    def rows(self) -> int:
        return int(self.positions.numel())


class PackedCaches:
    """The cache of a packed forward: each session's part goes to (and comes from) its own PartKVCache."""

    def __init__(self, steps: Sequence[BodyStep]):
        self.caches = [s.cache for s in steps]
        self.rows = [s.rows for s in steps]

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """key/value: (1, H_kv, sum T_i, D_h) -> the sessions' full keys/values, (1, H_kv, sum (S_i + T_i), D_h)."""
        keys, values = [], []
        for cache, k, v in zip(self.caches, key.split(self.rows, dim=2), value.split(self.rows, dim=2)):
            full_k, full_v = cache.update(k.contiguous(), v.contiguous(), layer_idx)  # not views of the pack
            keys.append(full_k)
            values.append(full_v)
        return torch.cat(keys, dim=2), torch.cat(values, dim=2)

    def append_positions(self, positions: torch.Tensor) -> None:
        for cache, part in zip(self.caches, positions.split(self.rows)):
            cache.append_positions(part)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return sum(len(c) for c in self.caches)


def session_mask(cache_positions: torch.Tensor, new_positions: torch.Tensor, parents: Sequence[int] | None,
                 window: int | None) -> torch.Tensor:
    """Boolean (T, S+T) mask of one session, spelled out where :func:`attention_mask` returns None (causal)."""
    s, t = int(cache_positions.numel()), int(new_positions.numel())
    mask = attention_mask(cache_positions, new_positions, parents, window)
    if mask is None:  # plain causal: every cached key, then a causal chain
        return torch.cat([torch.ones((t, s), dtype=torch.bool), torch.ones((t, t), dtype=torch.bool).tril()], dim=1)
    return mask[0, 0]


def packed_mask(steps: Sequence[BodyStep], window: int | None) -> torch.Tensor:
    """Block-diagonal boolean (1, 1, sum T_i, sum (S_i + T_i)) mask over the sessions' blocks."""
    blocks = [session_mask(s.cache.positions, s.positions.cpu(), s.parents, window) for s in steps]
    return torch.block_diag(*blocks)[None, None]


@torch.no_grad()
def run_packed(body: LayerStack, steps: Sequence[BodyStep]) -> list[torch.Tensor]:
    """Run every step through ``body`` in one forward; return each step's (1, T_i, d) output.

    Appends to every step's cache. On an exception the caches may hold a part
    of the forward: the caller crops each back to its length before the call.
    """
    hidden = torch.cat([s.hidden for s in steps], dim=1)  # (1, sum T_i, d)
    positions = torch.cat([s.positions.cpu() for s in steps])  # (sum T_i,)
    masks = {}
    for kind in set(body.layer_types):
        window = body.sliding_window if kind == "sliding_attention" else None
        masks[kind] = packed_mask(steps, window)
    out = body.run_layers(hidden, positions, PackedCaches(steps), None, masks=masks)  # (1, sum T_i, d)
    return list(out.split([s.rows for s in steps], dim=1))
