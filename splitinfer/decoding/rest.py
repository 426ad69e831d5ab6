"""``rest``: retrieval-based drafting from a datastore of public text on the local side (REST).

He et al. 2023, "REST: Retrieval-Based Speculative Decoding" (arXiv
2311.08252). Each step finds the longest suffix of the context (``min_match``
to ``max_match`` tokens) that occurs in the datastore
(:mod:`splitinfer.decoding.datastore`: the ``train`` splits of ``corpora``,
up to ``max_tokens`` tokens, tokenised with the model's tokenizer), gathers
the ``depth`` tokens that followed its first ``max_samples`` occurrences,
counts them in a trie, and drafts the best ``draft_budget`` nodes by path
frequency (REST's frequency-ranked trie selection).

The datastore is public text: it reveals nothing of the user's, and the cloud
sees only the drafted tokens, as with every proposer. Deviations: matches are
tried from the longest suffix down (REST tries fixed lengths 16, 14, ... 2),
the occurrences read are the first ``max_samples`` by position, and a
datastore is built per process from corpora rather than loaded prebuilt.
Without a tokenizer (a replay that names none) the datastore is empty and the
proposer drafts nothing.
"""

from __future__ import annotations

from splitinfer.decoding.base import EMPTY, Candidate, Draft, Proposer, check_positive, register_proposer
from splitinfer.decoding.datastore import Datastore, count_tree, ensure_store
from splitinfer.decoding.suffix import tree_to_candidates
from splitinfer.errors import SplitInferError

DEFAULT_CORPORA = "chat,code,prose"


@register_proposer("rest")
class Rest(Proposer):
    """REST: frequency-ranked continuation trees of the context's longest suffix in a public datastore."""

    def __init__(self, *, draft_budget: int = 16, depth: int = 8, min_match: int = 2, max_match: int = 12,
                 max_samples: int = 128, min_prob: float = 0.05, corpora: str = DEFAULT_CORPORA,
                 max_tokens: int = 400_000):
        self.budget = check_positive("draft_budget", draft_budget)
        self.depth = check_positive("depth", depth)
        self.min_match = check_positive("min_match", min_match)
        self.max_match = check_positive("max_match", max_match)
        self.max_samples = check_positive("max_samples", max_samples)
        self.max_tokens = check_positive("max_tokens", max_tokens, 0)
        if not 0 <= min_prob <= 1:
            raise SplitInferError(f"rest needs 0 <= min_prob <= 1, got {min_prob}")
        self.min_prob, self.corpora = float(min_prob), str(corpora)
        self.store: Datastore | None = None

    def begin(self, prompt, env) -> None:
        super().begin(prompt, env)
        self.store = ensure_store(self.store, env, self.corpora, self.max_tokens, self.max_match)

    def speculation(self, context: list[int]) -> list[tuple[int, int, float, float]]:
        if self.store is None:
            return []
        m, starts = self.store.longest_match(context, self.max_match)
        if m < self.min_match:
            return []
        seqs = self.store.continuations(starts, m, self.depth, self.max_samples)
        return count_tree(seqs, self.budget, self.min_prob)

    def candidates(self, context: list[int]) -> list[Candidate]:
        return tree_to_candidates(self.speculation(context), "rest")

    def propose(self, context: list[int]) -> Draft:
        tree = self.speculation(context)
        if not tree:
            return EMPTY
        return Draft(tuple(t for t, _, _, _ in tree), tuple(p for _, p, _, _ in tree))
