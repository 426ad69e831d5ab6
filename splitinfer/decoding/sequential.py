"""``sequential``: no draft; one token per round trip (the baseline every proposer must match)."""

from __future__ import annotations

from splitinfer.decoding.base import EMPTY, Draft, Proposer, register_proposer


@register_proposer("sequential")
class Sequential(Proposer):
    """Always the empty draft: the verifier then runs plain greedy or sampled decoding."""

    def __init__(self):
        pass

    def propose(self, context: list[int]) -> Draft:
        return EMPTY
