"""Several sessions' body steps as ONE forward of the body layers: packed rows, attention per session.

Continuous batching in LLM servers (Yu et al., "Orca: A Distributed Serving
System for Transformer-Based Generative Models", OSDI 2022) runs the
requests that are ready as one batch at every step, however far along each
one is. Orca's *selective batching* flattens the requests' tokens into one
sequence for the token-wise operations (linear layers, norms, MLP) and splits
them for attention. This module does the same on the stock decoder layers:

- the sessions' new rows are concatenated into one sequence ``(1, sum T_i, d)``
  with their own absolute positions (so rotary embeddings are each session's);
- :class:`PackedCaches` is the cache object the attention modules see: its
  ``update`` splits the new keys/values per session and appends each part to
  that session's own :class:`~splitinfer.kv_cache.PartKVCache`;
- attention is then computed **per session** (Orca's split): the attention
  implementation :data:`PACKED_ATTENTION`, switched on for the duration of the
  packed forward, takes each session's query rows and runs the model's own
  attention kernel (sdpa, or the batch-invariant one) over that session's
  cached and new keys alone, with exactly the mask an unbatched forward builds
  (None for a plain causal step, else the causal chain, the token tree from
  ``parents`` and the sliding window). No session's keys, values or scores
  enter another session's arithmetic, so a session whose values overflow
  cannot turn another's result into NaN (before, attention ran over the whole
  packed key block with a block-diagonal mask, and ``0 x NaN = NaN`` leaked
  across sessions; issue 30).

Why packing and not padding (transformers' per-row ``attention_mask`` and
``position_ids`` over a padded ``DynamicCache``): the sessions keep their own
caches (their ``keep`` / ``crop`` edits and ``--max-context`` checks stay per
session), no linear-layer compute is spent on padding rows when one session
sends a 30-node draft tree and another a single token, and with the
batch-invariant kernels (:mod:`splitinfer.batch_invariant`) a row's result is
bit-identical to its unbatched forward: its attention is the unbatched
attention call itself and the padded linear layers are row-invariant up to
:data:`~splitinfer.batch_invariant.MAX_ROWS` rows (the scheduler never packs
more). Cost: attention is one kernel call per session and layer, over that
session's keys only (the old block-diagonal mask was new rows x all keys:
8 sessions of 4,032 cached positions took 339 ms packed vs 56 ms one by one,
issue 30 finding 6; ``docs/server.md`` has the figures after the change).
Deviations: with the default kernels the matrix products over more rows round
differently, so states differ from the unbatched ones by float32 noise
(greedy tokens agree; see ``docs/server.md``); the switch of the attention
implementation is per model config, so packed forwards must not run
concurrently with each other (the scheduler runs one at a time; unbatched
forwards running meanwhile on other threads go to the model's own kernel).
A model whose own attention is ``eager`` (not in transformers' attention registry)
gets sdpa per session with boolean masks in a packed forward: float noise against its
unbatched eager forward, no leak between sessions.
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


PACKED_ATTENTION = "splitinfer_packed"
_BASE_ATTR = "_splitinfer_packed_base"  # on a model config: the attention implementation packing replaced


class PackedCaches:
    """The cache of a packed forward: each session's part goes to its own PartKVCache."""

    def __init__(self, steps: Sequence[BodyStep]):
        self.caches = [s.cache for s in steps]
        self.rows = [s.rows for s in steps]

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Append each session's part of key/value (1, H_kv, sum T_i, D_h) to its cache; return them unchanged.

        :func:`packed_attention` reads each session's full keys from its own cache, so nothing is concatenated.
        """
        for cache, k, v in zip(self.caches, key.split(self.rows, dim=2), value.split(self.rows, dim=2)):
            cache.update(k.contiguous(), v.contiguous(), layer_idx)  # not views of the pack
        return key, value

    def append_positions(self, positions: torch.Tensor) -> None:
        for cache, part in zip(self.caches, positions.split(self.rows)):
            cache.append_positions(part)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return sum(len(c) for c in self.caches)


class SessionMasks:
    """What :func:`packed_attention` gets as its ``attention_mask``: each session's rows, cache and own mask."""

    def __init__(self, packed: PackedCaches, masks: Sequence[torch.Tensor | None], base: str):
        self.packed, self.masks, self.base = packed, list(masks), base

    def to(self, device) -> SessionMasks:
        return SessionMasks(self.packed, [None if m is None else m.to(device) for m in self.masks], self.base)


def _attention_function(name: str):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS.get_interface(name, sdpa_attention_forward)


def packed_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention of a packed forward, one session at a time over its own keys (registered as PACKED_ATTENTION).

    query: (1, H, sum T_i, D_h); key/value: the new rows only (the full keys are in each session's cache).
    Returns ((1, sum T_i, H, D_h), None) like transformers' attention functions. Called with anything but
    :class:`SessionMasks` (an unbatched forward on another thread while a packed one runs), it is the
    model's own attention function.
    """
    if not isinstance(attention_mask, SessionMasks):
        base = _attention_function(getattr(module.config, _BASE_ATTR, "sdpa"))
        return base(module, query, key, value, attention_mask, **kwargs)
    sm, layer = attention_mask, module.layer_idx
    fn = _attention_function(sm.base)
    outs = []
    for cache, q, mask in zip(sm.packed.caches, query.split(sm.packed.rows, dim=2), sm.masks):
        out, _ = fn(module, q, cache.keys[layer], cache.values[layer], mask, **kwargs)  # (1, T_i, H, D_h)
        outs.append(out)
    return torch.cat(outs, dim=1), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_ATTENTION, packed_attention)


def _configs(body: LayerStack) -> list:
    """The distinct model configs the body's attention modules read."""
    seen = {}
    for layer in body.layers:
        cfg = getattr(getattr(layer, "self_attn", None), "config", None) or body.config
        seen[id(cfg)] = cfg
    return list(seen.values())


@torch.no_grad()
def run_packed(body: LayerStack, steps: Sequence[BodyStep]) -> list[torch.Tensor]:
    """Run every step through ``body`` in one forward; return each step's (1, T_i, d) output.

    Appends to every step's cache. On an exception the caches may hold a part
    of the forward: the caller crops each back to its length before the call.
    """
    hidden = torch.cat([s.hidden for s in steps], dim=1)  # (1, sum T_i, d)
    positions = torch.cat([s.positions.cpu() for s in steps])  # (sum T_i,)
    packed = PackedCaches(steps)
    configs = _configs(body)
    base = configs[0]._attn_implementation
    if base == PACKED_ATTENTION:
        raise RuntimeError("run_packed is already running on this model (packed forwards run one at a time)")
    masks = {}
    for kind in set(body.layer_types):
        window = body.sliding_window if kind == "sliding_attention" else None
        masks[kind] = SessionMasks(packed, [attention_mask(s.cache.positions, s.positions.cpu(), s.parents, window)
                                            for s in steps], base)
    _register()
    for cfg in configs:
        setattr(cfg, _BASE_ATTR, cfg._attn_implementation)  # set before the switch: other threads read it
        cfg._attn_implementation = PACKED_ATTENTION
    try:
        out = body.run_layers(hidden, positions, packed, None, masks=masks)  # (1, sum T_i, d)
    finally:
        for cfg in configs:
            cfg._attn_implementation = getattr(cfg, _BASE_ATTR)
    return list(out.split([s.rows for s in steps], dim=1))
