"""Token trees as parent arrays: validation, depths and ancestor masks.

A draft of ``n`` tokens is a tree encoded by ``parents``: ``parents[i]`` is
the index of node ``i``'s parent among the draft's own nodes, or ``-1`` for a
child of the last committed token. Parents always precede their children
(``parents[i] < i``), so a chain is ``[-1, 0, 1, ...]``. Node ``i`` sits at
position ``base + depth[i]`` and attends to the committed context plus its
ancestors and itself (SpecInfer, Miao et al. 2024; Medusa tree attention).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from splitinfer.errors import SplitInferError


def validate_parents(parents: Sequence[int], n: int | None = None) -> None:
    """Raise SplitInferError unless ``parents`` is a valid topologically ordered tree."""
    if n is not None and len(parents) != n:
        raise SplitInferError(f"parent array has {len(parents)} entries for {n} tokens")
    for i, p in enumerate(parents):
        if not isinstance(p, int) or isinstance(p, bool):
            raise SplitInferError(f"parent array entry {i} is {p!r}, not an integer")
        if not -1 <= p < i:
            raise SplitInferError(f"parent array entry {i} is {p}; it must be -1 or an earlier node (< {i})")


def chain_parents(n: int) -> list[int]:
    """Parent array of a chain of ``n`` tokens (plain causal order)."""
    return [i - 1 for i in range(n)]


def is_chain(parents: Sequence[int]) -> bool:
    return all(p == i - 1 for i, p in enumerate(parents))


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node; roots (parent -1) have depth 0."""
    out: list[int] = []
    for p in parents:
        out.append(0 if p < 0 else out[p] + 1)
    return out


def ancestor_matrix(parents: Sequence[int]) -> torch.Tensor:
    """(n, n) bool: entry [i, j] is True iff node j is node i or one of its ancestors."""
    n = len(parents)
    m = torch.zeros((n, n), dtype=torch.bool)
    for i, p in enumerate(parents):
        m[i, i] = True
        if p >= 0:
            m[i] |= m[p]
    return m


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """Indices from the root down to ``node`` (inclusive)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]
