"""``random-split``: the client draws the head depth of each session from a set.

The serving cloud necessarily learns the depth (it must run the right
layers); what this can hide is the depth from anyone who sees only the states
(a log, a leaked dump, a second party). The draw is keyed by (seed, session)
with the same counter-based hash as the noise (:mod:`splitinfer.defenses.keyed`),
so it is reproducible and independent of call order. The runtime serves one
split per body today, so this defense is measured on states (``splitinfer
attack`` / the ``defenses`` bench stage): depth identification, then the
per-depth attacker. The set of depths is public (DESIGN.md section 4,
``adaptive``); the seed is the secret.
"""

from __future__ import annotations

from dataclasses import dataclass

from splitinfer.defenses.base import Defense, DefenseError, register_defense
from splitinfer.defenses.keyed import position_keys


@register_defense("random-split")
@dataclass(frozen=True)
class RandomSplit(Defense):
    """Head depth drawn uniformly from ``depths`` per session."""

    depths: tuple = (2, 4, 8)
    seed: int = 0

    kind = "model"
    strength = ("depths",)
    secret = ("seed",)

    def validate(self) -> None:
        if not self.depths or any(not isinstance(d, int) or d < 1 for d in self.depths):
            raise DefenseError(f"random-split: depths={self.depths!r} must be head depths >= 1; "
                               "e.g. --defense-option random-split.depths=2,4,8")
        if len(set(self.depths)) != len(self.depths):
            raise DefenseError(f"random-split: depths={self.depths!r} repeats a depth; list each once")

    def draw(self, session: int) -> int:
        """The head depth of session number ``session``."""
        key = int(position_keys(self.seed, session, [0], "up")[0]) & ((1 << 62) - 1)
        return self.depths[key % len(self.depths)]
