"""``lookahead``: lookahead decoding (Fu et al. 2024, "Break the Sequential Dependency of LLM
Inference Using Lookahead Decoding").

Each step carries two branches in the same forward pass (one round trip):

- the *lookahead branch*: a 2-D Jacobi window of ``window`` (W) columns and
  ``ngram - 1`` (N-1) levels of guessed tokens. Encoded as a token tree: level
  0 is a chain of W guesses after the committed-next token, and on each
  level-0 guess ``c`` hangs a chain through levels 1..N-2 (the diagonal of
  Fu et al.'s Figure 2, whose attention pattern is exactly a tree path). The
  model's output at the top of diagonal ``c`` completes an N-gram, which
  goes into the pool; the window then drops level 0 and takes the outputs as
  its new top level (one Jacobi iteration per step).
- the *verification branch*: up to ``pool`` (G) N-grams from the pool whose
  first token is the committed-next token, merged into a trie.

The pool keeps at most G continuations per key, least recently used out.
Any tree node whose token matches the model's greedy output is accepted,
so a lucky lookahead guess is accepted too (still exact).

Deviations: the window slides one column per step whatever the step
accepted (as in Fu et al.'s reference code, which ignores the shift); all
levels start as random prompt tokens rather than being filled during a
warm-up; ``prompt_ngrams=True`` additionally seeds the pool from the prompt.
"""

from __future__ import annotations

import random
from collections import OrderedDict

from splitinfer.decoding.base import Candidate, Draft, Proposer, StepFeedback, check_positive, register_proposer
from splitinfer.decoding.merge import merge_candidates


def lookahead_tree(levels: list[list[int]], offset: int) -> tuple[list[int], list[int], list[list[int]]]:
    """Tree nodes of a Jacobi window, appended after ``offset`` existing draft nodes.

    ``levels[j][c]`` is the level-j guess of diagonal ``c``. Returns tokens,
    parents (draft indices; -1 = child of the committed-next token) and, per
    diagonal, its node indices from level 0 up.
    """
    w = len(levels[0])
    tokens, parents, diagonals = [], [], []
    level0 = []
    for c in range(w):
        level0.append(offset + len(tokens))
        parents.append(level0[c - 1] if c > 0 else -1)
        tokens.append(levels[0][c])
    for c in range(w):
        diag = [level0[c]]
        for j in range(1, len(levels)):
            parents.append(diag[-1])
            diag.append(offset + len(tokens))
            tokens.append(levels[j][c])
        diagonals.append(diag)
    return tokens, parents, diagonals


@register_proposer("lookahead")
class Lookahead(Proposer):
    """Fu et al.'s lookahead decoding: Jacobi window W x N plus an LRU n-gram pool of G per key."""

    learns_from_rejected = True

    def __init__(self, *, window: int = 5, ngram: int = 5, pool: int = 5, seed: int = 0, prompt_ngrams: bool = False):
        self.w = check_positive("window", window)
        self.n = check_positive("ngram", ngram, 2)
        self.g = check_positive("pool", pool)
        self.seed, self.prompt_ngrams = seed, bool(prompt_ngrams)
        self.pool: dict[int, OrderedDict[tuple[int, ...], None]] = {}
        self.levels: list[list[int]] = []
        self._diagonals: list[list[int]] = []

    def begin(self, prompt, env) -> None:
        super().begin(prompt, env)
        self.rng = random.Random(self.seed)
        self.prompt = list(prompt)
        self.pool = {}
        if self.prompt_ngrams:
            for i in range(len(prompt) - self.n + 1):
                self._add(tuple(prompt[i : i + self.n]))
        self.levels = [[self._random() for _ in range(self.w)] for _ in range(self.n - 1)]

    def _random(self) -> int:
        return self.rng.choice(self.prompt)

    def _add(self, ngram: tuple[int, ...]) -> None:
        entries = self.pool.setdefault(ngram[0], OrderedDict())
        entries[ngram[1:]] = None
        entries.move_to_end(ngram[1:])
        while len(entries) > self.g:
            entries.popitem(last=False)

    def candidates(self, context: list[int]) -> list[Candidate]:
        conts = list(reversed(self.pool.get(context[-1], OrderedDict())))  # most recent first
        return [Candidate(c, (1.0 / (1 + r),) + (1.0,) * (len(c) - 1), "lookahead", r) for r, c in enumerate(conts)]

    def branch(self, offset: int) -> tuple[list[int], list[int]]:
        """The lookahead branch's nodes, to be appended after ``offset`` draft nodes (see ``update``)."""
        tokens, parents, self._diagonals = lookahead_tree(self.levels, offset)
        return tokens, parents

    def propose(self, context: list[int]) -> Draft:
        tree = merge_candidates(self.candidates(context))
        tokens, parents = self.branch(len(tree))
        return Draft(tuple(tree.tokens) + tuple(tokens), tuple(tree.parents) + tuple(parents))

    def update(self, context, accepted, feedback: StepFeedback | None = None) -> None:
        if feedback is None or not self._diagonals or not len(feedback.draft):
            self._diagonals = []
            return
        top = []
        for c, diag in enumerate(self._diagonals):
            out = feedback.node_argmax[diag[-1]]
            if out is None:  # pruned by the verifier near the end of generation
                out = self._random()
            else:
                self._add(tuple(self.levels[j][c] for j in range(len(self.levels))) + (out,))
            top.append(out)
        self.levels = self.levels[1:] + [top]
        self._diagonals = []
