"""KV cache of one part of a split model, and the attention masks it needs.

:class:`PartKVCache` implements the one method transformers' attention
modules call on a cache (``update``), keyed by the *global* layer index, so
the stock decoder layers run unchanged on any contiguous range of layers.
It also records the absolute position of every cached entry, which lets it
build causal, sliding-window and token-tree masks, and supports the two
edits speculative decoding needs: crop to a length, and keep an accepted
subset of the entries appended by the last forward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from splitinfer.decoding.tree import ancestor_matrix
from splitinfer.errors import SplitInferError
from splitinfer.protocol import short


class PartKVCache:
    """Keys/values for a range of decoder layers of one sequence (batch 1)."""

    def __init__(self, max_len: int | None = None) -> None:
        self.max_len = max_len  # refuse to grow beyond this many entries (the server's --max-context)
        self.keys: dict[int, torch.Tensor] = {}  # layer -> (1, H_kv, S, D_h)
        self.values: dict[int, torch.Tensor] = {}  # layer -> (1, H_kv, S, D_h)
        self.positions = torch.zeros(0, dtype=torch.long)  # (S,) absolute position of each entry

    def __len__(self) -> int:
        return int(self.positions.numel())

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return len(self)

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Append (1, H_kv, T, D_h) keys/values for ``layer_idx``; return the full (1, H_kv, S+T, D_h)."""
        old = self.keys[layer_idx].shape[-2] if layer_idx in self.keys else 0
        self._check_room(old + key.shape[-2])
        if layer_idx in self.keys:
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], key], dim=-2)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], value], dim=-2)
        else:
            self.keys[layer_idx] = key
            self.values[layer_idx] = value
        return self.keys[layer_idx], self.values[layer_idx]

    def _check_room(self, length: int) -> None:
        if self.max_len is not None and length > self.max_len:
            raise SplitInferError(f"context of {length} tokens exceeds the limit of {self.max_len} (--max-context)")

    def append_positions(self, positions: torch.Tensor) -> None:
        self._check_room(len(self) + int(positions.numel()))
        self.positions = torch.cat([self.positions, positions.to("cpu", torch.long)])

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` entries."""
        if not 0 <= length <= len(self):
            raise SplitInferError(f"cannot crop a KV cache of {len(self)} entries to {length}")
        for layer in self.keys:
            self.keys[layer] = self.keys[layer][:, :, :length]
            self.values[layer] = self.values[layer][:, :, :length]
        self.positions = self.positions[:length]

    @staticmethod
    def check_keep(length: int, prefix: int, accepted: Sequence[int]) -> int:
        """Validate a ``keep`` against a cache of ``length`` entries; return the length it leaves.

        ``prefix`` must lie within the cache and ``accepted`` be strictly increasing
        indices into the ``length - prefix`` entries after it, so a keep can only
        shrink the cache (never repeat an entry).
        """
        if isinstance(prefix, bool) or not isinstance(prefix, int) or not 0 <= prefix <= length:
            raise SplitInferError(f"keep prefix {short(prefix)} is outside the cache of {length} entries")
        n_new = length - prefix
        last = -1
        for i in accepted:
            if isinstance(i, bool) or not isinstance(i, int) or not last < i < n_new:
                raise SplitInferError(
                    f"cannot keep nodes {short(list(accepted))} of the {n_new} new entries after prefix {prefix}: "
                    "they must be strictly increasing indices into those entries"
                )
            last = i
        return prefix + len(accepted)

    def keep(self, prefix: int, accepted: Sequence[int]) -> None:
        """Keep entries ``[0, prefix)`` plus ``prefix + i`` for each i in ``accepted`` (strictly increasing).

        Used after tree verification: the entries appended by the last forward
        are the draft's nodes; only the accepted path survives.
        """
        self.check_keep(len(self), prefix, accepted)
        if list(accepted) == list(range(len(accepted))):
            self.crop(prefix + len(accepted))
            return
        idx = torch.cat([torch.arange(prefix), prefix + torch.as_tensor(list(accepted), dtype=torch.long)])
        for layer in self.keys:
            dev_idx = idx.to(self.keys[layer].device)
            self.keys[layer] = self.keys[layer].index_select(2, dev_idx)
            self.values[layer] = self.values[layer].index_select(2, dev_idx)
        self.positions = self.positions[idx]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for d in (self.keys, self.values) for t in d.values())


def attention_mask(
    cache_positions: torch.Tensor,
    new_positions: torch.Tensor,
    parents: Sequence[int] | None,
    sliding_window: int | None,
    explicit: bool = False,
) -> torch.Tensor | None:
    """Boolean (1, 1, T, S+T) mask, True = may attend; None when plain causal needs no mask (never if ``explicit``).

    cache_positions: (S,) positions already cached; new_positions: (T,).
    Without ``parents`` the new tokens are a causal chain; with them, a token
    tree (each node sees the cache plus its ancestors). ``sliding_window``
    additionally hides keys whose position is ``>= window`` behind the query.
    """
    s, t = int(cache_positions.numel()), int(new_positions.numel())
    if parents is None and sliding_window is None and (s == 0 or t == 1) and not explicit:
        return None  # sdpa's own causal path, exactly as the unsplit model runs it
    if parents is None:
        new_block = torch.ones((t, t), dtype=torch.bool).tril()
    else:
        new_block = ancestor_matrix(parents)
    mask = torch.cat([torch.ones((t, s), dtype=torch.bool), new_block], dim=1)  # (T, S+T)
    if sliding_window is not None:
        kv_pos = torch.cat([cache_positions, new_positions.cpu()])
        mask &= (new_positions.cpu()[:, None] - kv_pos[None, :]) < sliding_window
    return mask[None, None]


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean mask (True = may attend) -> additive float mask (0 or the dtype's minimum), as eager attention adds."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
