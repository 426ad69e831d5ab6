"""``ngram-pool``: the seed paper's 'lookahead' decoding, replicated faithfully.

Cunningham 2026 (arXiv 2602.16760; reference code ``jacobi_server.py``,
``generate_stream_lookahead``): a pool maps a token to the n-grams that
followed it, seeded from every window of the (chat-formatted) prompt and
grown with one n-gram per step from the output. Each step looks up the
committed-next token and verifies the first ``pool`` (G) stored
continuations of ``ngram - 1`` tokens, each as its own branch under that
token, accepting the longest match.

Kept from the seed on purpose: candidates are the *oldest* G entries for the
key (insertion order), only the n-gram ending at the newest token is added
per step (n-grams inside a multi-token acceptance are skipped), and branches
are not merged (identical prefixes are verified twice). The seed's
relocation of the winning branch's KV entries is the verifier's ``keep``.
"""

from __future__ import annotations

from collections.abc import Sequence

from splitinfer.decoding.base import EMPTY, Candidate, Draft, Proposer, check_positive, register_proposer
from splitinfer.decoding.merge import chains_to_draft


def build_pool(tokens: Sequence[int], n: int) -> dict[int, list[tuple[int, ...]]]:
    """key token -> distinct (n-1)-token continuations, in order of first appearance."""
    pool: dict[int, list[tuple[int, ...]]] = {}
    for i in range(len(tokens) - n + 1):
        add_ngram(pool, tokens[i], tuple(tokens[i + 1 : i + n]))
    return pool


def add_ngram(pool: dict[int, list[tuple[int, ...]]], key: int, cont: tuple[int, ...]) -> None:
    entries = pool.setdefault(int(key), [])
    if cont not in entries:
        entries.append(cont)


@register_proposer("ngram-pool")
class NgramPool(Proposer):
    """The seed's n-gram pool keyed by the last token; G candidates of N-1 tokens."""

    def __init__(self, *, ngram: int = 5, pool: int = 5, merge: bool = False):
        self.n = check_positive("ngram", ngram, 2)
        self.g = check_positive("pool", pool, 1)
        self.merge = bool(merge)  # False = the seed's separate branches
        self.pool: dict[int, list[tuple[int, ...]]] = {}

    def begin(self, prompt, env) -> None:
        super().begin(prompt, env)
        self.pool = build_pool(prompt, self.n)

    def candidates(self, context: list[int]) -> list[Candidate]:
        return [
            Candidate(c, (1.0 / (1 + r),) + (1.0,) * (len(c) - 1), "ngram-pool", r)
            for r, c in enumerate(self.pool.get(context[-1], [])[: self.g])
        ]

    def propose(self, context: list[int]) -> Draft:
        chains = self.pool.get(context[-1], [])[: self.g]
        return chains_to_draft(chains, dedupe=self.merge) if chains else EMPTY

    def update(self, context, accepted, feedback=None) -> None:
        ids = list(context) + list(accepted)
        if len(ids) >= self.n:
            add_ngram(self.pool, ids[-self.n], tuple(ids[-self.n + 1 :]))
