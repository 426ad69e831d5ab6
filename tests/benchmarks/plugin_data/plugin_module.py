"""A ``--plugin`` module for the tests (not installed): a working proposer and a defense whose output is broken.

``repeat-last`` drafts the context's last token three times (verification keeps decoding exact);
``nan-mix`` releases NaN states, so the harness must leave it out and list it, and run the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from splitinfer.decoding.base import Draft, Proposer, register_proposer
from splitinfer.defenses.base import Defense, register_defense


@register_proposer("repeat-last")
class RepeatLast(Proposer):
    """Draft ``n`` copies of the last token."""

    def __init__(self, *, n: int = 3):
        self.n = n

    def propose(self, context: list[int]) -> Draft:
        return Draft.chain([context[-1]] * self.n) if context else Draft()


@register_defense("nan-mix")
@dataclass(frozen=True)
class NanMix(Defense):
    """Broken on purpose: every released value is NaN."""

    scale: float = 1.0
    kind = "wire"
    strength = ("scale",)

    def apply(self, x, positions, session, direction, content=None):
        return x if direction == "down" else torch.full_like(x, float("nan"))
