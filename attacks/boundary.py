"""A split boundary of an attack: where the taps are taken, written ``head:A`` or ``tail:B``.

- ``head:A``: the states after the first ``A`` decoder layers, i.e. what a
  :class:`~splitinfer.partition.LocalHead` of ``A`` layers sends to the cloud.
- ``tail:B``: the states after the first ``L - B`` layers, i.e. what the cloud
  body returns to a :class:`~splitinfer.partition.LocalTail` of ``B`` layers.

Both must be real split points: ``1 <= A <= L - 2`` and ``1 <= B <= L - 2``
(a split keeps at least one layer in the body and one in each local part).
Code passes :class:`Boundary` objects; the string form is for the edges
(command-line flags, taps metadata, results keys). A leaf module (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

from attacks.errors import AttackError


@dataclass(frozen=True)
class Boundary:
    """A split boundary: ``head:A`` (what the cloud receives) or ``tail:B`` (what it returns)."""

    side: str  # "head" | "tail"
    layers: int  # A (head layers) or B (tail layers)

    @classmethod
    def parse(cls, text: str | Boundary) -> Boundary:
        """Parse ``"head:A"`` or ``"tail:B"``."""
        if isinstance(text, Boundary):
            return text
        side, sep, n = str(text).strip().partition(":")
        if side not in ("head", "tail") or not sep or not n.strip().isdigit():
            raise AttackError(f"bad boundary {text!r}: write head:A (after A layers, what the cloud receives) or "
                              "tail:B (after L-B layers, what the cloud returns to a B-layer tail), e.g. head:2")
        return cls(side, int(n))

    def validate(self, num_layers: int) -> None:
        """Raise AttackError unless this is a split point of an ``num_layers``-layer model."""
        hi = num_layers - 2
        if not 1 <= self.layers <= hi:
            what = "head layers A" if self.side == "head" else "tail layers B"
            raise AttackError(f"boundary {self} is outside the model: it has {num_layers} layers, so {what} must lie "
                              f"in [1, {hi}] (a split keeps >= 1 layer in the body and in each local part)")

    def depth(self, num_layers: int) -> int:
        """Number of decoder layers run from the embedding to reach this boundary."""
        self.validate(num_layers)
        return self.layers if self.side == "head" else num_layers - self.layers

    def __str__(self) -> str:
        return f"{self.side}:{self.layers}"
