"""Merging guessed continuations into one de-duplicated token tree (pure functions).

Candidates from one or many sources (:class:`~splitinfer.decoding.base.Candidate`)
are inserted into a trie rooted at the context's last token, so shared
prefixes are verified once (SpecInfer, Miao et al. 2024). Each trie node
gets a score: the estimated probability that the verifier accepts the whole
path down to it, the product of per-token conditional estimates along the
candidate, maximised over the candidates that pass through the node. Because
a node's score never exceeds its parent's, the ``n`` best nodes (ties broken
by depth) always form a valid, prefix-closed tree, and the expected tokens
per step of that tree is ``1 + sum(scores)``.

:func:`best_size` then picks how many nodes to send by maximising expected
tokens per unit of step time under a linear cost ``fixed + per_token * T``
(the step-time model of DESIGN.md section 6).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from splitinfer.decoding.base import Candidate, Draft


@dataclass
class MergedTree:
    """A trie of candidate tokens; node order is topological (parents first)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # -1 = child of the context's last token
    scores: list[float] = field(default_factory=list)  # estimated P(path to node accepted)
    depths: list[int] = field(default_factory=list)  # 1 = direct child of the context's last token
    origins: list[list[tuple[str, int, int, float]]] = field(default_factory=list)  # (source, rank, depth, conf)

    def __len__(self) -> int:
        return len(self.tokens)


def default_cond(cand: Candidate, k: int) -> float:
    """Conditional acceptance estimate of ``cand.tokens[k]``: the source's own confidence."""
    return cand.conf[k] if k < len(cand.conf) else 1.0


def merge_candidates(
    candidates: Sequence[Candidate],
    cond: Callable[[Candidate, int], float] = default_cond,
    max_nodes: int | None = None,
) -> MergedTree:
    """Insert ``candidates`` (in order) into a trie; score nodes by path probability.

    ``cond(candidate, k)`` estimates P(token k accepted | tokens before it
    accepted), clipped to [0, 1]. ``max_nodes`` stops creating new nodes once
    reached (later candidates can still raise existing nodes' scores).
    """
    tree = MergedTree()
    children: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    for cand in candidates:
        parent, p = -1, 1.0
        for k, tok in enumerate(cand.tokens):
            p *= min(1.0, max(0.0, float(cond(cand, k))))
            node = children.get((parent, tok))
            if node is None:
                if max_nodes is not None and len(tree) >= max_nodes:
                    break
                node = len(tree)
                children[(parent, tok)] = node
                tree.tokens.append(int(tok))
                tree.parents.append(parent)
                tree.scores.append(p)
                tree.depths.append(k + 1)
                tree.origins.append([])
            else:
                tree.scores[node] = max(tree.scores[node], p)
            tree.origins[node].append((cand.source, cand.rank, k + 1, cand.conf[k] if k < len(cand.conf) else 1.0))
            parent = node
    return tree


def ranked_nodes(tree: MergedTree) -> list[int]:
    """Node indices best first: score descending, then depth, then index (prefix-closed prefixes)."""
    return sorted(range(len(tree)), key=lambda i: (-tree.scores[i], tree.depths[i], i))


def select(tree: MergedTree, n: int) -> tuple[Draft, list[int]]:
    """The draft made of the ``n`` best nodes, and the tree index of each draft node."""
    keep = sorted(ranked_nodes(tree)[: max(0, n)])  # topological order preserved
    new_index = {old: i for i, old in enumerate(keep)}
    parents = []
    for old in keep:
        p = tree.parents[old]
        if p >= 0 and p not in new_index:  # cannot happen for monotone scores; guard anyway
            raise AssertionError("selected nodes are not prefix-closed")
        parents.append(-1 if p < 0 else new_index[p])
    return Draft(tuple(tree.tokens[i] for i in keep), tuple(parents)), keep


def best_size(scores_desc: Sequence[float], budget: int, fixed_ms: float, per_token_ms: float) -> int:
    """Number of draft nodes maximising expected tokens per ms.

    A step that sends the context's last token plus ``n`` draft nodes is
    modelled to take ``fixed_ms + per_token_ms * (n + 1)`` and to commit
    ``1 + sum(scores_desc[:n])`` tokens in expectation. Returns ``n`` in
    ``[0, min(budget, len(scores_desc))]``; ties go to the smaller tree.
    """
    best_n, best_rate = 0, 1.0 / max(1e-9, fixed_ms + per_token_ms)
    gain = 1.0
    for n in range(1, min(budget, len(scores_desc)) + 1):
        gain += scores_desc[n - 1]
        rate = gain / max(1e-9, fixed_ms + per_token_ms * (n + 1))
        if rate > best_rate * (1 + 1e-9):
            best_n, best_rate = n, rate
    return best_n


def chains_to_draft(chains: Sequence[Sequence[int]], dedupe: bool = True) -> Draft:
    """Several continuations as one draft: a trie (``dedupe``) or independent branches (as the seed does)."""
    if dedupe:
        tree = merge_candidates([Candidate(tuple(c), (1.0,) * len(c), "chain", r) for r, c in enumerate(chains)])
        return Draft(tuple(tree.tokens), tuple(tree.parents))
    tokens: list[int] = []
    parents: list[int] = []
    for chain in chains:
        for k, tok in enumerate(chain):
            parents.append(-1 if k == 0 else len(tokens) - 1)
            tokens.append(int(tok))
    return Draft(tuple(tokens), tuple(parents))
