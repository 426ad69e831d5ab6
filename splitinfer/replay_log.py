"""The client's record of what the cloud body's KV cache holds, so a lost cache can be rebuilt.

The cloud keeps a KV cache per session; if the connection drops or the
server restarts, that cache is gone. The client still has every hidden state
it sent, so it can rebuild the cache by sending them again. :class:`ReplayLog`
mirrors the body cache's edits exactly:

- after a ``forward`` the new rows are *pending* (a draft chain or tree);
- the next ``forward`` either carries ``keep`` (commit an accepted path,
  :meth:`~splitinfer.kv_cache.PartKVCache.keep`) or nothing (all pending rows
  stay, as in sequential decoding); a ``commit`` keeps a path or crops to a
  length.

Only committed rows are recorded, in position order, so the log is always a
causal chain ``0 .. length-1`` and one causal forward over it rebuilds the
cache: every committed row originally attended to exactly the committed rows
before it (a tree node sees the committed context plus its ancestors, which
are the accepted path before it). The rebuilt keys/values equal the original
ones up to float rounding of a batched versus an incremental forward.

If an edit would leave the cache holding something that is not such a chain
(a tree kept whole, a non-path subset), the log marks itself ``broken`` with
the reason, and recovery raises a clear error instead of guessing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class ReplayLog:
    """Committed hidden states of one cloud session, in position order."""

    def __init__(self) -> None:
        self.chunks: list[torch.Tensor] = []  # each (1, n_i, d) in the wire dtype
        self.length = 0  # committed rows: positions 0 .. length-1
        self.pending: tuple[torch.Tensor, list[int] | None] | None = None  # last forward: hidden (1, T, d), parents
        self.broken: str | None = None  # why the log cannot rebuild the cache any more

    def reset(self) -> None:
        self.__init__()

    @property
    def n_pending(self) -> int:
        return 0 if self.pending is None else int(self.pending[0].shape[1])

    # ---------------------------------------------------------------- edits mirrored from the body cache
    def before_forward(self, keep: dict | None) -> None:
        """Resolve the pending rows as the body will when it receives the next forward."""
        if keep is not None:
            self.keep(keep["prefix"], keep["accepted"])
        else:
            self.crop(self.length + self.n_pending)  # sequential decoding: every pending row stays

    def after_forward(self, hidden: torch.Tensor, positions: Sequence[int], parents: Sequence[int] | None) -> None:
        """Record a forward's rows (``hidden`` (1, T, d)) as pending."""
        if self.pending is not None:  # before_forward was skipped: cannot know what the body kept
            self._break("a forward was recorded without resolving the previous one")
        expected = _depths(parents, len(positions))
        if list(positions) != [self.length + d for d in expected]:
            self._break(f"positions {list(positions)[:4]}... do not continue the {self.length} committed rows")
        self.pending = (hidden.detach(), None if parents is None else list(parents))

    def keep(self, prefix: int, accepted: Sequence[int]) -> None:
        """Mirror ``PartKVCache.keep(prefix, accepted)`` over committed + pending rows."""
        total = self.length + self.n_pending
        if not 0 <= prefix <= total or any(not 0 <= i < total - prefix for i in accepted):
            self._break(f"keep(prefix={prefix}, accepted={list(accepted)}) is out of range")
            return
        self._select(list(range(prefix)) + [prefix + i for i in accepted])

    def crop(self, length: int) -> None:
        """Mirror ``PartKVCache.crop(length)`` over committed + pending rows."""
        total = self.length + self.n_pending
        if not 0 <= length <= total:
            self._break(f"crop to {length} is out of range")
            return
        self._select(list(range(length)))

    def _select(self, rows: list[int]) -> None:
        """Keep ``rows`` (indices into committed + pending); they must form a replayable chain."""
        committed = [r for r in rows if r < self.length]
        new = [r - self.length for r in rows if r >= self.length]
        if committed != list(range(len(committed))):
            self._break("an edit kept committed rows that are not a prefix")
        elif new and len(committed) != self.length:
            self._break("an edit kept draft rows after dropping committed ones")
        elif new and not _is_path(self.pending[1], new):
            self._break(f"draft nodes {new} kept in the cache are not one root-to-node path of the tree")
        if self.broken:
            self.pending = None
            return
        self._crop_committed(len(committed))
        if new:
            hidden = self.pending[0]
            self.chunks.append(hidden[:, new] if new != list(range(hidden.shape[1])) else hidden)
            self.length += len(new)
        self.pending = None

    def _crop_committed(self, n: int) -> None:
        if n == self.length:
            return
        kept, seen = [], 0
        for c in self.chunks:
            if seen >= n:
                break
            take = min(c.shape[1], n - seen)
            kept.append(c if take == c.shape[1] else c[:, :take])
            seen += take
        self.chunks, self.length = kept, n

    def _break(self, reason: str) -> None:
        if self.broken is None:
            self.broken = reason

    # ---------------------------------------------------------------- replay
    def replay_chunks(self, max_bytes: int) -> list[tuple[torch.Tensor, list[int]]]:
        """The committed rows as (hidden (1, n, d), positions) pieces of at most ``max_bytes`` each."""
        if not self.length:
            return []
        hidden = torch.cat(self.chunks, dim=1) if len(self.chunks) > 1 else self.chunks[0]  # (1, L, d)
        row_bytes = hidden.shape[2] * hidden.element_size()
        step = max(1, max_bytes // max(1, row_bytes))
        self.chunks = [hidden]  # keep the concatenation: the next replay is free
        starts = range(0, self.length, step)
        return [(hidden[:, i : i + step], list(range(i, min(i + step, self.length)))) for i in starts]

    def nbytes(self) -> int:
        rows = sum(c.numel() * c.element_size() for c in self.chunks)
        return rows + (0 if self.pending is None else self.pending[0].numel() * self.pending[0].element_size())


def _depths(parents: Sequence[int] | None, n: int) -> list[int]:
    if parents is None:
        return list(range(n))
    out: list[int] = []
    for i, p in enumerate(parents):
        out.append(0 if p < 0 else (out[p] + 1 if p < i else -(10**9)))
    return out


def _is_path(parents: Sequence[int] | None, nodes: Sequence[int]) -> bool:
    """True iff ``nodes`` (in order) are a root-to-node path: each one the child of the one before."""
    prev = -1
    for j in nodes:
        parent = j - 1 if parents is None else parents[j]
        if parent != prev:
            return False
        prev = j
    return True
