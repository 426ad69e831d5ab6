"""Per-step timing of split generation and its summary.

Each round trip through the cloud body is one :class:`StepTiming`; the
components add up to ``total_ms`` (``other_ms`` is the remainder: Python
overhead, token selection, streaming). The fitted RTT decomposition model
of DESIGN.md section 6 builds on these records.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

COMPONENTS = ("head_ms", "body_ms", "tail_ms", "codec_ms", "network_ms", "other_ms")


@dataclass
class StepTiming:
    """Milliseconds of one round trip (one step), and what it carried."""

    head_ms: float = 0.0  # local head layers (+ embedding)
    body_ms: float = 0.0  # cloud body layers, as reported by the cloud
    tail_ms: float = 0.0  # local tail layers + norm + LM head + token selection
    codec_ms: float = 0.0  # frame encode + decode, both sides
    network_ms: float = 0.0  # time on the wire (emulated WAN included)
    other_ms: float = 0.0  # remainder of total_ms
    total_ms: float = 0.0
    tokens_sent: int = 0  # positions carried to the cloud (1 for a sequential step)
    tokens_committed: int = 0  # tokens this step added to the output
    bytes_up: int = 0
    bytes_down: int = 0

    def finish(self, total_ms: float) -> None:
        self.total_ms = total_ms
        parts = self.head_ms + self.body_ms + self.tail_ms + self.codec_ms + self.network_ms
        self.other_ms = max(0.0, total_ms - parts)

    def to_dict(self) -> dict:
        return asdict(self)


def mean_breakdown(steps: list[StepTiming], skip_first: bool = True) -> dict[str, float]:
    """Mean milliseconds per step for each component.

    The first step (the prompt's prefill) is skipped by default so the figures
    describe steady-state decoding; it is used when it is the only step.
    """
    use = steps[1:] if skip_first and len(steps) > 1 else steps
    if not use:
        return {k: 0.0 for k in (*COMPONENTS, "total_ms")}
    return {k: sum(getattr(s, k) for s in use) / len(use) for k in (*COMPONENTS, "total_ms")}
