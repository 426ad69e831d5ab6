"""``jacobi``: block Jacobi iteration, the seed paper's parallel decoder (for replication).

Santilli et al. 2023 ("Accelerating Transformer Inference for Translation via
Parallel Decoding"), as used by Cunningham 2026 (arXiv 2602.16760, reference
code ``jacobi_server.py``): keep a block of ``block`` guessed tokens after
the committed-next token, initialised at random over the vocabulary; each
step feeds the block as a chain and the new guess at every position is the
model's greedy output one position earlier (the fixed-point update).

Deviations from the seed, both forced by doing it exactly: the seed only
commits when the whole block has converged (and crops and retries
otherwise); here every step commits the converged prefix the verifier
accepts (the longest guess prefix equal to the model's own greedy tokens, plus
the bonus token), so no round trip is wasted, and the block slides forward
(refilled with random tokens) instead of restarting. The output is
token-identical to sequential decoding, which the seed's path was not.
"""

from __future__ import annotations

import random

from splitinfer.decoding.base import Draft, Proposer, StepFeedback, check_positive, register_proposer


@register_proposer("jacobi")
class Jacobi(Proposer):
    """Block Jacobi decoding: the previous step's outputs are this step's guesses."""

    learns_from_rejected = True

    def __init__(self, *, block: int = 16, seed: int = 0):
        self.block = check_positive("block", block, 2)
        self.seed = seed
        self.guess: list[int] = []

    def begin(self, prompt, env) -> None:
        super().begin(prompt, env)
        self.rng = random.Random(self.seed)
        self.guess = []

    def _fill(self) -> None:
        while len(self.guess) < self.block - 1:
            self.guess.append(self.rng.randrange(self.env.vocab_size))

    def propose(self, context: list[int]) -> Draft:
        self._fill()
        return Draft.chain(self.guess)

    def update(self, context, accepted, feedback: StepFeedback | None = None) -> None:
        if feedback is None or not len(feedback.draft):
            self.guess = []
            return
        m = len(feedback.accepted_nodes)  # guesses confirmed this step
        # Node i's output guesses the token two positions after it; the bonus token was node m-1's
        # output, so node m's output is the new guess right after the bonus, and so on.
        new = [a for a in feedback.node_argmax[m:] if a is not None]
        self.guess = new
