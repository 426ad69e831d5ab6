"""The cloud body as a network service: ``splitinfer serve``.

An asyncio WebSocket server (the ``websockets`` package) carrying the binary
frames of :mod:`splitinfer.protocol` to a :class:`~splitinfer.session.BodyService`.
Settings: :mod:`splitinfer.server_config`; loading the body:
:mod:`splitinfer.body_loader`. Its threat model is in ``docs/server.md``.

- **Before login** a connection is *pending*: it sits in a separate pool of
  ``max_pending`` (smaller than ``max_connections``); when the pool is full the
  oldest pending connection is dropped to make room, so silent connections
  cannot lock out a client that says hello at once. Its frames may be at most
  ``hello_max_bytes`` (websockets cuts a larger one off at its header, close
  code 1009, before buffering it), so decoding the hello on the event loop is
  bounded; it must arrive within ``hello_timeout_s`` and carry the
  shared-secret ``token`` when one is configured (:func:`hmac.compare_digest`).
- **After login** the frame limit becomes ``--max-frame-mb``; the connection
  counts against ``max_connections``. Every request runs in a thread pool
  (each session has its own lock), so the loop keeps answering pings and other
  clients while a body forward runs. The workers hand their body steps to
  the service's :class:`~splitinfer.batch_scheduler.BatchScheduler`, which
  runs the steps of concurrent sessions as one packed forward
  (``--max-batch``, ``--batch-window-ms``); the pool has at least
  ``--max-batch`` threads so that a full batch can gather.
- **Quotas and timeouts.** Sessions per connection, in all, and positions per
  session: :class:`~splitinfer.session.ServiceLimits`. A logged-in connection
  is dropped after ``connection_idle_s`` without real work (a forward, or a
  commit that changed a cache; stats and empty commits do not count), and any
  message must be complete within ``message_timeout_s`` of its first byte (a
  client trickling a fragmented message is dropped). The opening handshake
  must finish within ``open_timeout_s``; a client that stops answering
  keepalive pings is dropped after ``ping_interval_s + ping_timeout_s``.
- **Sessions are per server**, several per connection; closing a connection
  closes its sessions, and a connection cannot touch (or see in ``stats``)
  another's sessions.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from splitinfer.body_loader import body_inventory, load_body, make_service  # noqa: F401 (re-exported)
from splitinfer.errors import ProtocolError
from splitinfer.inflight import InflightBudget, default_limit_bytes
from splitinfer.protocol import Limits, decode_frame, error_frame, short
from splitinfer.server_config import ServerConfig, check_device, is_loopback  # noqa: F401 (re-exported)
from splitinfer.session import BodyService

log = logging.getLogger(__name__)

FRAME_SLACK_BYTES = 2**20


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # not Linux
        return 0


def _single_intra_op_thread() -> None:
    """Make the calling thread run its tensor work on one intra-op thread (a request thread of ``serve``).

    With PyTorch's OpenMP backend, once a second application thread has run parallel work (a cast of a long
    prefill's frame, a prefill of more than 128 rows, a reply's encoding) every thread's parallel work is slower:
    on the 2-core machine of the reports a single-token step of the default model's body took 49.4-50.2 ms on
    the main thread after a worker had cast one 4,096 x 576 tensor, against 27.7-28.0 ms without, and 28.4-28.8
    ms beside a worker kept to one intra-op thread (``python -m benchmarks.compute_thread``). With one intra-op
    thread a request thread starts no OpenMP pool; a long step on it then runs on one core (its cost to other
    tenants' prefills: ``reports/server_batching/report.md``, "Long prefills beside single-token steps").
    ``torch.set_num_threads`` sets the calling thread's OpenMP and MKL thread counts (and the default of threads
    that start their tensor work later); the main thread, which loaded the model, keeps its own.
    """
    import torch

    torch.set_num_threads(1)


class TimedConnection(ServerConnection):
    """A server connection that knows since when an incoming message has been arriving (None: none is),
    and whose received bytes count against the server's :class:`~splitinfer.inflight.InflightBudget`."""

    budget: InflightBudget | None = None  # set by BodyServer before it serves

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.message_since: float | None = None
        self._event = False
        self._paused_by = set()  # "websockets" (its own queue is full) and/or "budget"
        self.charged = False  # logged in: its bytes count (before, its frames are limited to --hello-max-kb)

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.recv_messages.pause = lambda: self._pause("websockets")
        self.recv_messages.resume = lambda: self._resume("websockets")

    def _pause(self, who: str) -> None:
        if not self._paused_by and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self._paused_by.add(who)

    def _resume(self, who: str) -> None:
        self._paused_by.discard(who)
        if not self._paused_by and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def budget_pause(self) -> None:
        self._pause("budget")

    def budget_resume(self) -> None:
        self._resume("budget")

    def quiet(self) -> bool:
        """Nothing partly received and nothing queued: every byte received so far has been answered."""
        return self.message_since is None and not len(self.recv_messages.frames)

    def data_received(self, data: bytes) -> None:
        if self.charged:
            self.budget.charge(self, len(data))
        if self.message_since is None:
            self.message_since = time.monotonic()
        self._event = False
        super().data_received(data)
        if self._event and not self.protocol.reader.buffer and self.protocol.current_size is None:
            self.message_since = None  # every byte received so far belongs to complete frames and messages

    def connection_lost(self, exc) -> None:
        if self.charged:
            self.budget.forget(self)
        super().connection_lost(exc)

    def process_event(self, event) -> None:
        self._event = True
        super().process_event(event)


class BodyServer:
    """Serves one :class:`BodyService` over WebSocket."""

    def __init__(self, service: BodyService, config: ServerConfig):
        config.validate()
        self.service, self.config = service, config
        self.connections = 0  # logged in
        self._pending: OrderedDict[int, ServerConnection] = OrderedDict()  # not logged in yet, oldest first
        self._ids = itertools.count(1)
        # a worker waits while its step is batched: enough of them that a full batch can gather
        workers = max(config.workers, service.scheduler.config.max_batch)
        # forwards hosted on one thread (serve): request threads keep to one intra-op thread, so that no second
        # OpenMP pool is ever started (see _single_intra_op_thread)
        single = service.scheduler.hosted
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="body",
                                        initializer=_single_intra_op_thread if single else None)
        self._started = time.monotonic()
        self._inventory = body_inventory(service.body)
        self._hello_limits = Limits(max_frame_bytes=config.hello_max_bytes,
                                    max_header_bytes=min(config.hello_max_bytes, Limits().max_header_bytes))
        self.url: str | None = None
        self.budget = InflightBudget(config.max_inflight_bytes or default_limit_bytes(
            service.limits.frame.max_frame_bytes))
        service.extra_stats = self._extra_stats

    def _extra_stats(self, everyone: bool) -> dict:
        if not everyone:
            return dict(self._inventory)
        return {"connections": self.connections, "pending": len(self._pending), "rss_bytes": _rss_bytes(),
                "inflight_bytes": self.budget.used, "inflight_peak_bytes": self.budget.peak,
                "inflight_limit_bytes": self.budget.limit,
                "uptime_s": round(time.monotonic() - self._started, 3), **self._inventory}

    async def serve(self, stop: asyncio.Event, on_ready: Callable[[str], None] | None = None) -> None:
        """Listen until ``stop`` is set, then close every connection and return."""
        cfg = self.config
        ctx = cfg.ssl_context()
        async with serve(
            self._handler, cfg.host, cfg.port, ssl=ctx, compression=None, server_header=None,
            max_size=cfg.hello_max_bytes, max_queue=2, create_connection=self._connection_class(),
            open_timeout=cfg.open_timeout_s, ping_interval=cfg.ping_interval_s, ping_timeout=cfg.ping_timeout_s,
            close_timeout=cfg.close_timeout_s,
        ) as server:
            port = server.sockets[0].getsockname()[1]
            host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
            self.url = f"{'wss' if ctx else 'ws'}://{host}:{port}"
            reaper = asyncio.create_task(self._reap())
            if on_ready:
                on_ready(self.url)
            await stop.wait()
            log.info("shutting down: closing %d connection(s)", self.connections)
            reaper.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.service.scheduler.close()

    def _connection_class(self) -> type[TimedConnection]:
        """TimedConnection bound to this server's byte budget."""
        return type("BudgetedConnection", (TimedConnection,), {"budget": self.budget})

    async def _reap(self) -> None:
        period = max(0.05, min(self.service.limits.idle_timeout_s / 4, 5.0))
        while True:
            await asyncio.sleep(period)
            self.service.expire_idle()

    # ------------------------------------------------------------------ one connection
    async def _handler(self, ws: TimedConnection) -> None:
        conn = next(self._ids)
        if len(self._pending) >= self.config.max_pending:  # make room: drop the oldest silent connection
            old_id, old = self._pending.popitem(last=False)
            log.warning("pending pool full (%d): dropping connection %d, which has not said hello",
                        self.config.max_pending, old_id)
            asyncio.ensure_future(self._refuse(old, "too many connections waiting for their hello; say hello "
                                                    "at once after connecting", 1013))
        self._pending[conn] = ws
        try:
            ok = await self._hello(ws, conn)
        finally:
            self._pending.pop(conn, None)
        if not ok:
            return
        if self.connections >= self.config.max_connections:
            await self._refuse(ws, f"server is at its limit of {self.config.max_connections} connections; "
                                   "retry later", 1013)
            return
        self.connections += 1
        ws.protocol.max_message_size = self.service.limits.frame.max_frame_bytes + FRAME_SLACK_BYTES
        ws.charged = True
        log.info("connection %d from %s logged in", conn, ws.remote_address)
        state = {"busy": False, "since": time.monotonic()}
        watchdog = asyncio.create_task(self._watch(ws, conn, state))
        try:
            loop = asyncio.get_running_loop()
            async for message in ws:
                if isinstance(message, str):
                    reply = error_frame("got a text message; the protocol uses binary frames")
                else:
                    state["busy"] = True
                    self.budget.start()
                    try:
                        reply = await loop.run_in_executor(self._pool, self.service.handle, message, conn)
                    finally:
                        state["busy"] = False
                        self.budget.finish()
                await ws.send(reply)
                self.budget.release(ws, len(message))  # answered: its bytes go back to the budget
                del message, reply
                if ws.quiet():  # every byte it sent has been answered (control frames too)
                    self.budget.release(ws)
        except ConnectionClosed:
            pass
        finally:
            watchdog.cancel()
            self.connections -= 1
            dropped = self.service.close_owned(conn)
            log.info("connection %d closed (%s); dropped %d session(s)", conn, ws.close_code, dropped)

    async def _watch(self, ws: TimedConnection, conn: int, state: dict) -> None:
        """Drop the connection when a message arrives too slowly or it does no real work for too long."""
        cfg = self.config
        period = max(0.05, min(cfg.message_timeout_s, cfg.connection_idle_s) / 4)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            since = ws.message_since
            if since is not None and now - since > cfg.message_timeout_s:
                await self._refuse(ws, f"a message took over {cfg.message_timeout_s:g} s to arrive "
                                       "(--message-timeout-s); send whole messages", 1008)
                return
            last = max(state["since"], self.service.last_work.get(conn, 0.0))
            if not state["busy"] and since is None and now - last > cfg.connection_idle_s:
                # no error frame and "going away": a well-behaved client reconnects and replays when it has work
                await self._refuse(ws, f"idle for over {cfg.connection_idle_s:g} s (--connection-idle-s)", 1001,
                                   send=False)
                return

    async def _hello(self, ws, conn: int) -> bool:
        """Wait for the hello frame, check the token, answer it; False (connection closed) on failure."""
        try:
            first = await asyncio.wait_for(ws.recv(), self.config.hello_timeout_s)
        except TimeoutError:
            await self._refuse(ws, f"no hello frame within {self.config.hello_timeout_s:g} s of connecting", 1008)
            return False
        except ConnectionClosed:
            return False
        problem = self._check_hello(first)
        if problem:
            await self._refuse(ws, problem, 1008)
            return False
        reply = self.service.handle(first, conn)  # a hello is small (bounded above) and carries no tensor
        try:
            await ws.send(reply)
        except ConnectionClosed:
            return False
        if decode_frame(reply).op != "welcome":  # the service refused it (version or body mismatch)
            await self._refuse(ws, "hello refused", 1008, send=False)
            return False
        return True

    def _check_hello(self, data) -> str | None:
        if isinstance(data, str):
            return "the first message must be a binary hello frame, got a text message"
        try:
            frame = decode_frame(data, self._hello_limits)
        except ProtocolError as e:
            return f"bad hello frame: {e}"
        if frame.op != "hello":
            return f"the first frame must be 'hello', got {short(frame.op)}"
        if self.config.token is not None:
            given = frame.fields.get("token")
            if not isinstance(given, str) or not hmac.compare_digest(given.encode(), self.config.token.encode()):
                log.warning("refused a hello with a missing or wrong token")
                return "hello refused: missing or wrong token (give the server's shared secret: --token-file)"
        return None

    @staticmethod
    async def _refuse(ws, message: str, code: int, send: bool = True) -> None:
        """Send an error frame and close; a peer that does not answer the close within 1 s is cut off."""
        try:
            if send:
                await asyncio.wait_for(ws.send(error_frame(message)), 1.0)
            await asyncio.wait_for(ws.close(code, message.encode()[:120].decode(errors="ignore")), 1.0)
        except (ConnectionClosed, TimeoutError):
            pass
        finally:
            if ws.transport is not None and not ws.transport.is_closing():
                ws.transport.abort()


def run_server(service: BodyService, config: ServerConfig, on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until SIGINT or SIGTERM, then shut down cleanly.

    Call it from the process's main thread: the body's forwards run there (the batch scheduler's loop,
    :meth:`~splitinfer.batch_scheduler.BatchScheduler.host`), the event loop on a second thread and the
    requests on worker threads limited to one intra-op thread each (:func:`_single_intra_op_thread`): only
    the main thread ever runs parallel tensor work. Raises what the event loop raised (e.g. the port is in use).
    """
    import signal

    import torch

    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("run_server must be called from the main thread (it hosts the body's forwards and "
                           "the signal handlers)")
    state: dict = {}

    async def main() -> None:
        stop, loop = asyncio.Event(), asyncio.get_running_loop()
        state["stop"] = lambda: loop.call_soon_threadsafe(stop.set)
        if state.get("signalled"):  # a signal came while the loop was starting
            stop.set()
        await BodyServer(service, config).serve(stop, on_ready)

    def event_loop() -> None:
        _single_intra_op_thread()  # the loop itself does no tensor work; if it ever does, no second pool
        try:
            asyncio.run(main())
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which raises it
            state["error"] = e
        finally:
            service.scheduler.close()  # lets host() return

    def on_signal(signum, frame) -> None:
        state["signalled"] = True
        if "stop" in state:
            state["stop"]()

    torch.set_num_threads(torch.get_num_threads())  # pin this thread's count before others change the default
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    thread = threading.Thread(target=event_loop, name="event-loop", daemon=True)
    try:
        service.scheduler.host(then=thread.start)  # the forwards, on this thread, until the event loop is done
        thread.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if "error" in state:
        raise state["error"]
