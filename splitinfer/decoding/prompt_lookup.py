"""``prompt-lookup``: prompt lookup decoding (Saxena 2023), as in HF ``prompt_lookup_num_tokens``.

Find the longest suffix of the context (up to ``ngram`` = 3 tokens) that
occurred earlier in the prompt or output, and draft the ``draft_budget``
(k) tokens that followed it. Deviation: the *most recent* earlier
occurrence is used (HF takes the first; ``occurrence="first"`` does as HF
does, and then also cuts a guess before its first EOS, as HF's candidate
generator does: with ``ngram=2, draft_budget=10`` it is transformers'
``prompt_lookup_num_tokens=10``, so it can be replayed as a peer; transformers
also drafts from the prompt alone and verifies that draft in the prefill
forward, which ``at_prefill=True`` adds for :func:`~splitinfer.decoding.replay.replay`
only: the split runtime's prefill carries no draft and refuses it); with
``candidates`` > 1 the next most recent distinct continuations are merged
into a tree, still at most ``draft_budget`` nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

from splitinfer.decoding.base import EMPTY, Candidate, Draft, Proposer, check_positive, register_proposer
from splitinfer.decoding.merge import merge_candidates, select
from splitinfer.errors import SplitInferError


def find_continuations(
    context: Sequence[int], max_ngram: int, k: int, max_candidates: int = 1, first: bool = False
) -> tuple[int, list[list[int]]]:
    """Continuations after earlier occurrences of the context's longest matching suffix.

    Tries suffix lengths ``max_ngram`` down to 1; for the first length with
    matches, returns ``(length, continuations)``: up to ``max_candidates``
    distinct non-empty continuations of up to ``k`` tokens, most recent
    occurrence first (``first``: earliest first). ``(0, [])`` when nothing matches.
    """
    n_ctx = len(context)
    for n in range(min(max_ngram, n_ctx - 1), 0, -1):
        suffix = list(context[n_ctx - n :])
        found: list[list[int]] = []
        # An occurrence ending at e (exclusive) must leave at least one token after it: e < n_ctx.
        ends = range(n, n_ctx) if first else range(n_ctx - 1, n - 1, -1)  # earliest or most recent first
        for end in ends:
            if context[end - 1] != suffix[-1] or list(context[end - n : end]) != suffix:
                continue
            cont = list(context[end : end + k])
            if cont and cont not in found:
                found.append(cont)
                if len(found) >= max_candidates:
                    break
        if found:
            return n, found
    return 0, []


@register_proposer("prompt-lookup")
class PromptLookup(Proposer):
    """Longest-suffix match (<= ``ngram`` tokens) against prompt + output; draft what followed."""

    def __init__(self, *, ngram: int = 3, draft_budget: int = 10, candidates: int = 1, occurrence: str = "recent",
                 at_prefill: bool = False):
        if not isinstance(at_prefill, bool):
            raise SplitInferError(f"prompt-lookup at_prefill must be true or false; got {at_prefill!r}")
        self.drafts_at_prefill = at_prefill
        self.ngram = check_positive("ngram", ngram)
        self.k = check_positive("draft_budget", draft_budget)
        self.max_candidates = check_positive("candidates", candidates)
        if occurrence not in ("recent", "first"):
            raise SplitInferError(f"prompt-lookup occurrence must be recent or first; got {occurrence!r}")
        self.first = occurrence == "first"

    def candidates(self, context: list[int]) -> list[Candidate]:
        n, conts = find_continuations(context, self.ngram, self.k, self.max_candidates, self.first)
        if self.first:  # transformers' rule: a guess stops before its first EOS
            eos = self.eos_ids
            conts = [c[: next((i for i, t in enumerate(c) if t in eos), len(c))] for c in conts]
            conts = [c for c in conts if c]
        conf = n / (n + 1.0)  # longer matches are more trustworthy
        return [Candidate(tuple(c), (conf / (1 + r),) + (1.0,) * (len(c) - 1), "prompt-lookup", r)
                for r, c in enumerate(conts)]

    def propose(self, context: list[int]) -> Draft:
        cands = self.candidates(context)
        if not cands:
            return EMPTY
        if len(cands) == 1:
            return Draft.chain(cands[0].tokens)
        tree = merge_candidates(cands, max_nodes=self.k)
        return select(tree, self.k)[0]
