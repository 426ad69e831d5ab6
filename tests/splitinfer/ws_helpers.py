"""Helpers for tests against a real ``splitinfer serve`` process on 127.0.0.1.

Servers start with ``--port 0`` (the OS picks a free port; the process
prints the URL it got), one compute thread (``OMP_NUM_THREADS=1``) and
stop by themselves at teardown (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

from websockets.sync.client import connect

from splitinfer.protocol import MAGIC, PROTOCOL_VERSION, decode_frame, encode_frame
from splitinfer.ws_link import _LEGACY

REPO = Path(__file__).resolve().parents[2]
_PREFIX = struct.Struct(">4sHI")


LIVE_SERVERS: "weakref.WeakSet[ServerProcess]" = weakref.WeakSet()  # read by conftest on a failing test


class ServerProcess:
    """A ``splitinfer serve`` subprocess; ``url`` once it is listening."""

    def __init__(self, model: str | Path, *args: str, port: int = 0, split: str = "2,2", log_dir: Path | None = None):
        self.cmd = [sys.executable, "-m", "splitinfer.cli", "-v", "serve", "--model", str(model), "--split", split,
                    "--host", "127.0.0.1", "--port", str(port), *args]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
        self._stderr_path = (log_dir or Path("/tmp")) / f"splitinfer-serve-{os.getpid()}-{id(self)}.log"
        self._stderr = open(self._stderr_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=self._stderr, cwd=REPO, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.url: str | None = None
        self.port: int | None = None
        LIVE_SERVERS.add(self)

    def _pump(self) -> None:
        for raw in self.proc.stdout:
            self.lines.put(raw.decode(errors="replace").rstrip("\n"))

    def wait_ready(self, timeout: float = 60.0) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.stderr()}")
                continue
            if line.startswith("listening on "):
                self.url = line.split()[-1]
                self.port = int(self.url.rsplit(":", 1)[1])
                return self
        raise RuntimeError(f"server not ready within {timeout} s:\n{self.stderr()}")

    def stderr(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        return self._stderr_path.read_text(errors="replace")[-4000:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()
        return self.proc.returncode


def raw_frame(header: dict | bytes, payload: bytes = b"", magic: bytes = MAGIC, version: int = PROTOCOL_VERSION,
              hlen: int | None = None) -> bytes:
    """A frame built by hand (possibly malformed)."""
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return _PREFIX.pack(magic, version, len(h) if hlen is None else hlen) + h + payload


def hello_frame(token: str | None = None, **fields) -> bytes:
    return encode_frame("hello", {"protocol": PROTOCOL_VERSION, **({"token": token} if token else {}), **fields})


class RawClient:
    """A websockets client that sends arbitrary bytes and reads the decoded replies."""

    def __init__(self, url: str, hello: bool = True, token: str | None = None, **kwargs):
        self.ws = connect(url, compression=None, max_size=None, open_timeout=10, **_LEGACY, **kwargs)
        if hello:
            reply = self.request(hello_frame(token))
            assert reply.op == "welcome", reply.fields

    def request(self, data: bytes | str, timeout: float = 20.0):
        self.ws.send(data)
        return decode_frame(self.ws.recv(timeout=timeout))

    def open(self) -> str:
        reply = self.request(encode_frame("open"))
        assert reply.op == "opened", reply.fields
        return reply.fields["session"]

    def stats(self) -> dict:
        reply = self.request(encode_frame("stats"))
        assert reply.op == "stats_reply", reply.fields
        return reply.fields

    def close(self) -> None:
        self.ws.close()


def server_stats(url: str) -> dict:
    c = RawClient(url)
    try:
        return c.stats()
    finally:
        c.close()


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def socket_closed_within(sock: socket.socket, timeout: float) -> float | None:
    """Seconds until the peer closed ``sock`` (EOF or reset), reading and discarding data; None if not."""
    t0 = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - t0 < timeout:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - t0
        except TimeoutError:
            continue
        except OSError:  # connection reset
            return time.monotonic() - t0
    return None


def ws_handshake(host: str, port: int) -> socket.socket:
    """A raw TCP socket that has completed a WebSocket opening handshake (for stalling tests)."""
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(
        b"GET / HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n" % (host.encode(), port)
    )
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(4096)
        assert chunk, "server closed during the handshake"
        buf += chunk
    assert buf.startswith(b"HTTP/1.1 101"), buf[:100]
    return s


def ws_binary_frame(payload: bytes) -> bytes:
    """One masked (client-to-server) binary WebSocket frame."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x82, 0x80 | n)
    elif n < 2**16:
        head = struct.pack("!BBH", 0x82, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x82, 0x80 | 127, n)
    mask = b"\x01\x02\x03\x04"
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
