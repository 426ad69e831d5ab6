"""A global budget for the request bytes a ``splitinfer serve`` holds at once, across all connections.

Each connection's frames were bounded (``--max-frame-mb``) but the number of
frames a connection held was not: websockets queues up to ``max_queue``
frames, reads the next one while a message is being processed, and the
handler's decoded copy and reply come on top. Measured (issue 30, finding 3):
about 3.4 frames per connection, 430 MiB for 16 connections sending 8 MiB
frames, about 28 GiB extrapolated to the defaults.

:class:`InflightBudget` counts every byte a connection receives from the
moment it arrives until the connection is *quiet* again (its reply sent,
nothing partly received, nothing queued; or the connection closed; a message's
own bytes go back as soon as its reply is sent). When the
count exceeds ``limit`` the connection that received the bytes stops being
read (``transport.pause_reading``: TCP flow control holds the rest on the
client's side) until enough is released; paused connections resume oldest
first. So that a budget full of half-received messages cannot stall every
connection, the oldest paused connection resumes anyway whenever no request
is being processed (nothing else would release bytes).

The bound on the counted bytes: ``limit`` plus about a frame (the connection
let through when nothing is processed) plus what a socket read returns per
connection before its pause takes effect (256 KiB each). Measured with 16
connections flooding 8 MiB frames at a 16 MiB budget: counted peak 28 MiB
(unbudgeted: 123 MiB); with 32 connections 54 MiB (153 MiB), so the
resumptions let through more than the formula says; not investigated
further. The process's RSS grows by several times the counted bytes (copies
while a frame is reassembled, unmasked and decoded; allocator slack): +200 MiB
and +234 MiB in those runs, against +393 MiB and +452 MiB unbudgeted.
``docs/server.md`` states it with the defaults.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

log = logging.getLogger(__name__)


def default_limit_bytes(max_frame_bytes: int) -> int:
    """A sixteenth of this machine's physical memory, at least two frames (the ``--max-inflight-mb`` default).

    A sixteenth because the process holds a few times the counted bytes at its peak (copies while a frame is
    reassembled, unmasked and decoded; allocator slack): measured about 7x at a 16 MiB budget.
    """
    try:
        import os

        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX
        phys = 8 * 2**30
    return max(phys // 16, 2 * max_frame_bytes)


class InflightBudget:
    """Bytes received and not yet answered, over all connections; pauses reading beyond ``limit``.

    Connections are objects with ``budget_pause()`` / ``budget_resume()`` (see
    :class:`splitinfer.server.TimedConnection`). Event-loop thread only.
    """

    def __init__(self, limit: int):
        self.limit = int(limit)
        self.used = 0
        self.peak = 0
        self.processing = 0  # requests between their arrival at the handler and their reply
        self._held: dict[int, int] = {}  # id(connection) -> bytes charged to it
        self._paused: OrderedDict[int, object] = OrderedDict()  # oldest first
        self._through: int | None = None  # the paused connection let through while nothing is processed

    def charge(self, conn, n: int) -> None:
        """``conn`` received ``n`` bytes: count them; pause it if the budget is exceeded."""
        self.used += n
        self.peak = max(self.peak, self.used)
        self._held[id(conn)] = self._held.get(id(conn), 0) + n
        if self.used > self.limit and id(conn) not in self._paused:
            self._paused[id(conn)] = conn
            if self._through == id(conn):  # it keeps its turn: finish one message before starting another's
                self._paused.move_to_end(id(conn), last=False)
            conn.budget_pause()
            self._unstall()

    def release(self, conn, n: int | None = None) -> None:
        """Give back ``n`` bytes charged to ``conn`` (a message answered; None: all of them, the connection is
        quiet or closed) and resume paused connections while the budget allows."""
        held = self._held.get(id(conn), 0)
        n = held if n is None else min(n, held)
        self.used -= n
        if held - n > 0:
            self._held[id(conn)] = held - n
        else:
            self._held.pop(id(conn), None)
        if self._through == id(conn):  # its turn ends with its message: the next paused connection's comes
            self._through = None
        while self._paused and self.used <= self.limit:
            _, other = self._paused.popitem(last=False)
            other.budget_resume()
        self._unstall()

    def forget(self, conn) -> None:
        """``conn`` closed: give back everything charged to it."""
        self.release(conn)
        self._paused.pop(id(conn), None)

    def start(self) -> None:
        self.processing += 1

    def finish(self) -> None:
        self.processing -= 1
        self._unstall()

    def _unstall(self) -> None:
        """Nothing is being processed, so nothing will release bytes: let the oldest paused connection go on
        (one at a time: the one let through keeps its turn until its message is answered)."""
        if self.processing == 0 and self._paused and (self._through is None or self._through in self._paused):
            key, oldest = self._paused.popitem(last=False)
            self._through = key
            oldest.budget_resume()
