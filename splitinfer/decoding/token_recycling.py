"""``token-recycling``: drafts from the candidate tokens the model already produced (Token Recycling).

Luo et al. 2024, "Turning Trash into Treasure: Accelerating Inference of
Large Language Models with Token Recycling" (arXiv 2408.08696). Every
verified row's logits rank the whole vocabulary, but decoding keeps only the
argmax; Token Recycling keeps, for every token ``t``, the ``k`` most probable
next tokens the model gave the last time it saw ``t`` (an *adjacency table*
``t -> k candidates``, overwritten at every step from logits the verifier
already has: no extra model cost, ``V x k`` ids). A draft is a tree grown
breadth-first from the context's last token through the table: a node's
children are its token's table row. The table outlives a request (the
paper's "hot start").

Two tree shapes (``tree``; default ``dynamic``, ``max_depth`` 10: on the project's 20 prompts at 200
tokens it commits 2.01 tokens per round trip (pooled) against 1.92 for the static shape at depth 6;
``reports/decoding/report.txt``):

- ``static`` (the paper's): a fixed tree of ``draft_budget`` nodes over
  *ranks*, chosen once, best-first, by the prior that the rank-``r``
  candidate is right, ``0.5 ** r`` for ``r`` counted from 0 at every depth
  (so the rank-0 chain goes deepest, rank-1 branches less deep, ...), up to
  ``max_depth``; each step fills it with the table's tokens (BFS).
- ``dynamic``: best-first by the product of the stored probabilities along
  the path (EAGLE-2-like), ``draft_budget`` nodes, down to ``min_prob``.

``key=2`` (our extension, not in the paper) also keeps a row per *pair* (previous token, token) and
drafts from it when that pair was seen, else from the one-token row. Replayed on the project's 20 prompts
at 200 tokens against the split model's sequential outputs (tau pooled per category as ``bench decoding``
pools it; ``reports/decoding/RUN.md``): token-recycling alone 2.01 -> 2.23 tokens per round trip (2.32 with
``draft_budget`` 64), but inside ``combined`` at this CPU's 80 ms costs 2.365 -> 2.369 and code unchanged at
1.78; so the default stays ``key=1``.

Deviations: the table keeps probabilities beside the ids (the paper keeps
ids only), used as confidences inside ``combined`` and by the dynamic
shape; its static tree is built from a rank prior rather than the paper's
hand-tuned 80-node tree; a token with no table row yet drafts nothing below
it; EOS tokens are not expanded. With ``learn="committed"`` (default) the
table is updated only from committed rows (the prefill, the root and the
accepted path), which makes the proposer replayable exactly against a
sequential output (:mod:`.replay`); ``learn="all"`` also uses rejected
draft nodes' rows, as the paper does (then it cannot be replayed). Inside
``combined`` its tree's root-to-leaf paths are one more candidate source.
"""

from __future__ import annotations

import heapq

from splitinfer.decoding.base import EMPTY, Candidate, Draft, Proposer, StepFeedback, check_positive, register_proposer
from splitinfer.decoding.suffix import tree_to_candidates
from splitinfer.errors import SplitInferError

SOURCE = "token-recycling"
RANK_PRIOR = 0.5  # prior P(rank-r candidate right) ~ RANK_PRIOR ** r, for the static tree's shape


def static_shape(budget: int, k: int, max_depth: int) -> list[tuple[int, int]]:
    """The static tree over ranks: (parent index or -1, rank) per node, topological, ``budget`` nodes at most.

    Best-first by the product of ``RANK_PRIOR ** rank`` along the path (ties: shallower, then earlier).
    """
    out: list[tuple[int, int]] = []
    heap = [(-(RANK_PRIOR ** r), 1, r, -1, r) for r in range(k)]  # (-score, depth, tie, parent, rank)
    heapq.heapify(heap)
    tie = k
    while heap and len(out) < budget:
        neg, depth, _, parent, rank = heapq.heappop(heap)
        out.append((parent, rank))
        if depth < max_depth:
            me = len(out) - 1
            for r in range(k):
                heapq.heappush(heap, (neg * RANK_PRIOR ** r, depth + 1, tie, me, r))
                tie += 1
    return out


class AdjacencyTable:
    """For every token, the ``k`` most probable next tokens (and probabilities) last seen after it."""

    def __init__(self, k: int):
        self.k = k
        self.rows: dict[int, tuple[tuple[int, ...], tuple[float, ...]]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, key) -> tuple[tuple[int, ...], tuple[float, ...]]:
        return self.rows.get(key, ((), ()))

    def update(self, keys: list, ids, probs) -> None:
        """Overwrite the rows of ``keys[i]`` (a token, or a pair of tokens) with ``ids[i]`` / ``probs[i]``
        ((T, >= k)); rows with id -1 are unknown."""
        ids, probs = ids[:, : self.k].tolist(), probs[:, : self.k].tolist()
        for key, row, p in zip(keys, ids, probs):
            if row and row[0] >= 0:
                self.rows[key] = (tuple(row), tuple(p))


@register_proposer("token-recycling")
class TokenRecycling(Proposer):
    """Token Recycling: an adjacency table of the model's earlier top-k tokens, drafted as a BFS tree."""

    def __init__(self, *, k: int = 8, draft_budget: int = 32, max_depth: int = 10, tree: str = "dynamic",
                 min_prob: float = 0.0, learn: str = "committed", key: int = 1):
        self.k = check_positive("k", k)
        self.budget = check_positive("draft_budget", draft_budget)
        self.max_depth = check_positive("max_depth", max_depth)
        if tree not in ("static", "dynamic"):
            raise SplitInferError(f"token-recycling tree must be static or dynamic; got {tree!r}")
        if learn not in ("committed", "all"):
            raise SplitInferError(f"token-recycling learn must be committed or all; got {learn!r}")
        if isinstance(min_prob, bool) or not isinstance(min_prob, (int, float)) or not 0 <= min_prob < 1:
            raise SplitInferError(f"option min_prob must be a number in [0, 1), got {min_prob!r}")
        if key not in (1, 2):
            raise SplitInferError(f"token-recycling key must be 1 or 2 (tokens a row is keyed on); got {key!r}")
        self.tree, self.learn, self.min_prob, self.key = tree, learn, float(min_prob), key
        self.feedback_topk = self.k
        self.learns_from_rejected = learn == "all"
        self.table = AdjacencyTable(self.k)
        self.pairs = AdjacencyTable(self.k)  # key=2: rows keyed on (previous token, token)
        self.shape = static_shape(self.budget, self.k, self.max_depth)

    # ------------------------------------------------------------------ drafting
    def speculation(self, context: list[int]) -> list[tuple[int, int, float, float]]:
        """The draft tree: (token, parent index or -1, path probability, stored probability) per node."""
        prev = context[-2] if len(context) > 1 else None
        if self.tree == "static":
            return self._static(context[-1], prev)
        return self._dynamic(context[-1], prev)

    def row(self, token: int, prev: int | None) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The candidates after ``token``: with key=2 the row of (``prev``, ``token``) when seen, else ``token``'s."""
        if self.key == 2 and prev is not None:
            ids, probs = self.pairs.get((int(prev), int(token)))
            if ids:
                return ids, probs
        return self.table.get(int(token))

    def _static(self, last: int, prev: int | None) -> list[tuple[int, int, float, float]]:
        eos = self.eos_ids
        out: list[tuple[int, int, float, float]] = []
        index: dict[int, int] = {}  # shape index -> out index (absent: the node has no token)
        for s, (parent, rank) in enumerate(self.shape):
            if parent < 0:
                src, before, path_p = last, prev, 1.0
            elif parent in index and out[index[parent]][0] not in eos:
                node = out[index[parent]]
                src, path_p = node[0], node[2]
                before = last if node[1] < 0 else out[node[1]][0]
            else:
                continue
            ids, probs = self.row(src, before)
            if rank < len(ids):
                index[s] = len(out)
                out.append((ids[rank], -1 if parent < 0 else index[parent], path_p * probs[rank], probs[rank]))
        return out

    def _dynamic(self, last: int, prev: int | None) -> list[tuple[int, int, float, float]]:
        eos = self.eos_ids
        out: list[tuple[int, int, float, float]] = []
        heap: list[tuple[float, int, int, int, float, int]] = []  # (-path p, tie, token, parent, cond, depth)
        tie = 0

        def push(src: int, before: int | None, parent: int, path_p: float, depth: int) -> None:
            nonlocal tie
            ids, probs = self.row(src, before)
            for tok, p in zip(ids, probs):
                if path_p * p > self.min_prob:
                    heapq.heappush(heap, (-path_p * p, tie, tok, parent, p, depth))
                    tie += 1

        push(last, prev, -1, 1.0, 1)
        while heap and len(out) < self.budget:
            neg, _, tok, parent, p, depth = heapq.heappop(heap)
            out.append((tok, parent, -neg, p))
            if depth < self.max_depth and tok not in eos:
                push(tok, last if parent < 0 else out[parent][0], len(out) - 1, -neg, depth + 1)
        return out

    def candidates(self, context: list[int]) -> list[Candidate]:
        return tree_to_candidates(self.speculation(context), SOURCE)

    def propose(self, context: list[int]) -> Draft:
        tree = self.speculation(context)
        if not tree:
            return EMPTY
        return Draft(tuple(t for t, _, _, _ in tree), tuple(p for _, p, _, _ in tree))

    # ------------------------------------------------------------------ learning
    def update(self, context, accepted, feedback: StepFeedback | None = None) -> None:
        if feedback is None or feedback.topk_ids is None:
            return
        ids, probs = feedback.topk_ids, feedback.topk_probs  # (T, k) each
        if not len(feedback.draft):  # the prefill (rows = the prompt) or a step without a draft (the root)
            start = len(context) - ids.shape[0]
            tokens = list(context[start:])
            before = [context[i - 1] if i > 0 else None for i in range(start, len(context))]
            self._learn(tokens, before, ids, probs)
            return
        draft = feedback.draft
        tokens = [context[-1]] + [draft.tokens[i] for i in feedback.sent_nodes]  # one per row sent
        before = [context[-2] if len(context) > 1 else None] + [
            context[-1] if draft.parents[i] < 0 else draft.tokens[draft.parents[i]] for i in feedback.sent_nodes]
        if self.learn == "committed":
            row = {node: 1 + j for j, node in enumerate(feedback.sent_nodes)}
            rows = [0] + [row[i] for i in feedback.accepted_nodes]
        else:
            rows = list(range(len(tokens)))
        self._learn([tokens[r] for r in rows], [before[r] for r in rows], ids[rows], probs[rows])

    def _learn(self, tokens: list[int], before: list[int | None], ids, probs) -> None:
        """Overwrite the rows of ``tokens`` (and with key=2 of the pairs (``before[i]``, ``tokens[i]``))."""
        self.table.update([int(t) for t in tokens], ids, probs)
        if self.key == 2:
            known = [i for i, b in enumerate(before) if b is not None]
            self.pairs.update([(int(before[i]), int(tokens[i])) for i in known], ids[known], probs[known])
