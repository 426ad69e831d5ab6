"""Links between the local side and the cloud body, with WAN emulation and byte counting.

A :class:`Link` carries one request frame to the cloud and returns its reply
(one round trip). :class:`InProcessLink` calls a
:class:`~splitinfer.session.BodyService` in the same process but still
sends real encoded frames, so bytes and serialisation cost are real. Any
link can add an emulated WAN (:class:`WanProfile`): a fixed round-trip time,
seeded jitter and a bandwidth limit, applied as a sleep per round trip
(the kernel here has no ``netem``).
"""

from __future__ import annotations

import math
import random
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from splitinfer.errors import SplitInferError


@dataclass(frozen=True)
class WanProfile:
    """Emulated network: delay per round trip = rtt + jitter + (bytes up + down) / bandwidth."""

    rtt_ms: float = 0.0
    bandwidth_mbps: float | None = None  # None = unlimited
    jitter_ms: float = 0.0  # std-dev of a normal added to the RTT (clipped at 0 total)
    seed: int = 0

    def __post_init__(self):
        # written so that NaN fails every check (NaN < 0 is false)
        if not 0 <= self.rtt_ms < math.inf:
            raise SplitInferError(f"rtt_ms must be a finite number >= 0, got {self.rtt_ms}")
        if self.bandwidth_mbps is not None and not 0 < self.bandwidth_mbps < math.inf:
            raise SplitInferError(f"bandwidth_mbps must be a finite number > 0, got {self.bandwidth_mbps}")
        if not 0 <= self.jitter_ms < math.inf:
            raise SplitInferError(f"jitter_ms must be a finite number >= 0, got {self.jitter_ms}")

    def transfer_s(self, nbytes: int) -> float:
        return 0.0 if self.bandwidth_mbps is None else nbytes * 8 / (self.bandwidth_mbps * 1e6)


@dataclass
class LinkStats:
    round_trips: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    emulated_s: float = 0.0  # time spent in the WAN emulation sleep
    wall_s: float = 0.0  # wall time of round trips as seen by the caller
    history: list = field(default_factory=list)  # (bytes_up, bytes_down, wall_s) per round trip


class Link(ABC):
    """Carries one frame to the cloud and returns the reply frame."""

    def __init__(self, wan: WanProfile | None = None):
        self.wan = wan or WanProfile()
        self.stats = LinkStats()
        self._rng = random.Random(self.wan.seed)

    def emulated_delay_s(self, bytes_up: int, bytes_down: int) -> float:
        """Seconds of emulated network time for one round trip of the given sizes."""
        w = self.wan
        jitter = self._rng.gauss(0.0, w.jitter_ms) if w.jitter_ms > 0 else 0.0
        return max(0.0, (w.rtt_ms + jitter) / 1e3) + w.transfer_s(bytes_up + bytes_down)

    def request(self, frame: bytes) -> bytes:
        """One round trip: send ``frame``, wait for and return the reply."""
        t0 = time.perf_counter()
        reply = self._exchange(frame)
        delay = self.emulated_delay_s(len(frame), len(reply))
        if delay > 0:
            _sleep_precise(delay)
        wall = time.perf_counter() - t0
        s = self.stats
        s.round_trips += 1
        s.bytes_sent += len(frame)
        s.bytes_received += len(reply)
        s.emulated_s += delay
        s.wall_s += wall
        s.history.append((len(frame), len(reply), wall))
        return reply

    @abstractmethod
    def _exchange(self, frame: bytes) -> bytes:
        """Deliver the frame and return the reply, without emulated delay."""

    def close(self) -> None:
        """Release the transport (no-op for in-process links)."""


class InProcessLink(Link):
    """Calls a BodyService in this process, through the real frame codec."""

    def __init__(self, service, wan: WanProfile | None = None):
        super().__init__(wan)
        self.service = service

    def _exchange(self, frame: bytes) -> bytes:
        return self.service.handle(frame)


def _sleep_precise(seconds: float) -> None:
    """Sleep with sub-0.1 ms accuracy: coarse sleep, then a short spin."""
    end = time.perf_counter() + seconds
    if seconds > 0.002:
        time.sleep(seconds - 0.0015)
    while time.perf_counter() < end:
        pass
