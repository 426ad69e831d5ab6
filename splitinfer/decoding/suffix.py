"""``suffix``: a suffix-trie cache over this request and previous outputs (SuffixDecoding-style).

Oliaro et al. 2024, "SuffixDecoding: A Model-Free Approach to Speeding Up
Large Language Model Inference". Two tries with occurrence counts hold every
substring (up to ``max_depth`` tokens) of (a) this request's prompt and
output so far and (b) the outputs of earlier requests through the same
proposer instance. Each step finds the longest suffix of the context (up to
``max_match`` tokens) that occurred earlier with a continuation, then grows a
speculation tree best-first from that trie node, scoring a node by the
product of ``count(child) / count(continuations of parent)`` along its path,
up to ``min(draft_budget, alpha * match_length)`` nodes and down to
``min_prob``; the tree with the higher expected acceptance (sum of scores)
of the two tries is drafted.

Deviations: a depth-limited suffix *trie* (``max_depth``) stands in for the
paper's suffix tree (same counts, simpler, O(max_depth) per token); counts
only include occurrences that have a continuation, so the context's own
final occurrence does not dilute them.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from splitinfer.decoding.base import EMPTY, Candidate, Draft, Proposer, check_positive, register_proposer
from splitinfer.errors import SplitInferError


class SuffixTrie:
    """Counts of all substrings up to ``max_depth`` tokens of the documents fed to it."""

    def __init__(self, max_depth: int = 48):
        self.max_depth = max_depth
        self.children: list[dict[int, int]] = [{}]
        self.count: list[int] = [0]
        self.depth: list[int] = [0]
        self.token: list[int] = [-1]  # label of the edge into each node
        self.active: list[int] = []  # nodes of the suffixes ending at the current end, deepest first

    def __len__(self) -> int:
        return len(self.count) - 1

    def start_document(self) -> None:
        self.active = []

    def extend(self, token: int) -> None:
        """Append ``token`` to the current document: every suffix ending here grows by one."""
        new_active = []
        for node in [*self.active, 0]:
            child = self.children[node].get(token)
            if child is None:
                child = len(self.count)
                self.children[node][token] = child
                self.children.append({})
                self.count.append(0)
                self.depth.append(self.depth[node] + 1)
                self.token.append(token)
            self.count[child] += 1
            if self.depth[child] < self.max_depth:
                new_active.append(child)
        self.active = new_active

    def add_document(self, tokens: Sequence[int]) -> None:
        self.start_document()
        for t in tokens:
            self.extend(int(t))
        self.start_document()

    def walk(self, tokens: Sequence[int]) -> int | None:
        node = 0
        for t in tokens:
            node = self.children[node].get(int(t))
            if node is None:
                return None
        return node

    def match(self, context: Sequence[int], max_match: int) -> tuple[int, int]:
        """(node, length) of the longest context suffix (<= max_match) that has a continuation; (0, 0) if none."""
        for n in range(min(max_match, len(context), self.max_depth - 1), 0, -1):
            node = self.walk(context[len(context) - n :])
            if node is not None and self.children[node]:
                return node, n
        return 0, 0

    def speculate(self, node: int, budget: int, min_prob: float) -> list[tuple[int, int, float, float]]:
        """Best-first tree under ``node``: (token, parent index or -1, path prob, conditional prob) per node.

        Node order is topological (a node is emitted after its parent).
        """
        out: list[tuple[int, int, float, float]] = []
        heap: list[tuple[float, int, int, int, float]] = []  # (-path prob, tie, trie node, parent idx, cond)

        def push(trie_node: int, parent_idx: int, prob: float) -> None:
            kids = self.children[trie_node]
            total = sum(self.count[c] for c in kids.values())
            for c in kids.values():
                cond = self.count[c] / total
                if prob * cond >= min_prob:
                    heapq.heappush(heap, (-prob * cond, c, c, parent_idx, cond))

        push(node, -1, 1.0)
        while heap and len(out) < budget:
            neg, _, c, parent_idx, cond = heapq.heappop(heap)
            out.append((self.token[c], parent_idx, -neg, cond))
            push(c, len(out) - 1, -neg)
        return out


def tree_to_candidates(tree: Sequence[tuple[int, int, float, float]], source: str) -> list[Candidate]:
    """Root-to-leaf paths of a speculation tree as candidates with per-token conditional confidences."""
    has_child = {p for _, p, _, _ in tree if p >= 0}
    cands = []
    for i in range(len(tree)):
        if i in has_child:
            continue
        path, j = [], i
        while j >= 0:
            path.append(j)
            j = tree[j][1]
        path.reverse()
        cands.append((tree[i][2], tuple(tree[k][0] for k in path), tuple(tree[k][3] for k in path)))
    cands.sort(key=lambda c: -c[0])
    return [Candidate(toks, conf, source, r) for r, (_, toks, conf) in enumerate(cands)]


@register_proposer("suffix")
class Suffix(Proposer):
    """SuffixDecoding: frequency-scored speculation trees from suffix tries (request + history)."""

    def __init__(
        self,
        *,
        draft_budget: int = 32,
        alpha: float = 2.0,
        min_prob: float = 0.1,
        max_match: int = 16,
        max_depth: int = 48,
        history: bool = True,
    ):
        self.budget = check_positive("draft_budget", draft_budget)
        self.max_match = check_positive("max_match", max_match)
        self.max_depth = check_positive("max_depth", max_depth, 2)
        if not (alpha > 0 and 0 <= min_prob <= 1):
            raise SplitInferError(f"suffix needs alpha > 0 and 0 <= min_prob <= 1, got {alpha}, {min_prob}")
        self.alpha, self.min_prob, self.history = float(alpha), float(min_prob), bool(history)
        self.global_trie = SuffixTrie(self.max_depth)  # outputs of earlier requests
        self.local_trie = SuffixTrie(self.max_depth)

    def begin(self, prompt, env) -> None:
        super().begin(prompt, env)
        self.local_trie = SuffixTrie(self.max_depth)
        self.local_trie.start_document()
        for t in prompt:
            self.local_trie.extend(int(t))

    def speculation(self, context: list[int]) -> tuple[list[tuple[int, int, float, float]], str]:
        """The better of the two tries' speculation trees for ``context``, and which trie it came from."""
        best, best_score, source = [], 0.0, "suffix"
        tries = [(self.local_trie, "suffix")] + ([(self.global_trie, "suffix-history")] if self.history else [])
        for trie, name in tries:
            node, n = trie.match(context, self.max_match)
            if n == 0:
                continue
            budget = min(self.budget, max(1, int(self.alpha * n)))
            tree = trie.speculate(node, budget, self.min_prob)
            score = sum(p for _, _, p, _ in tree)
            if score > best_score:
                best, best_score, source = tree, score, name
        return best, source

    def candidates(self, context: list[int]) -> list[Candidate]:
        tree, source = self.speculation(context)
        return tree_to_candidates(tree, source)

    def propose(self, context: list[int]) -> Draft:
        tree, _ = self.speculation(context)
        if not tree:
            return EMPTY
        return Draft(tuple(t for t, _, _, _ in tree), tuple(p for _, p, _, _ in tree))

    def update(self, context, accepted, feedback=None) -> None:
        for t in accepted:
            self.local_trie.extend(int(t))

    def end(self, prompt, output) -> None:
        if self.history and output:
            self.global_trie.add_document(output)
