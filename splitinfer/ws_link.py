"""A :class:`~splitinfer.link.Link` over a real WebSocket to ``splitinfer serve``.

:class:`WebSocketLink` is synchronous (the ``websockets`` sync client; a
background thread answers keepalive pings), carries one binary frame per
message and keeps the base class's WAN emulation and byte counting, so an
emulated RTT can be added on top of a real loopback connection.

Faults: a dropped connection, a closed socket or a reply that does not come
within ``reply_timeout_s`` raise :class:`~splitinfer.remote.ConnectionLost`;
:meth:`WebSocketLink.reconnect` then tries to connect again with bounded
exponential backoff, and :class:`~splitinfer.remote.RemoteBody` replays its
session. A server that refuses us on purpose (oversize reply, policy close)
raises :class:`~splitinfer.remote.CloudError` instead: retrying would not help.

Authentication: the shared-secret ``token`` (argument, else the environment
variable ``SPLITINFER_TOKEN``, else the file named by
``SPLITINFER_TOKEN_FILE``) travels in the hello frame. Use ``wss://`` for
anything but loopback; ``ca_file`` trusts a self-signed server certificate.

Not thread-safe: one link serves one :class:`RemoteBody` at a time.
"""

from __future__ import annotations

import inspect
import logging
import os
import ssl
import time
from pathlib import Path
from urllib.parse import urlsplit

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import connect

from splitinfer.errors import ProtocolError, SplitInferError
from splitinfer.link import Link, WanProfile
from splitinfer.protocol import DEFAULT_LIMITS
from splitinfer.remote import CloudError, ConnectionLost

log = logging.getLogger(__name__)

FRAME_SLACK_BYTES = 2**20  # websockets' max_size = frame limit + this (the codec names the exact limit)
# websockets >= 16 wants connect() as a context manager unless legacy=True asks for the plain connection.
_LEGACY = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}


def read_token_file(path: str | Path) -> str:
    """The shared secret in ``path`` (surrounding whitespace stripped); SplitInferError if missing or empty."""
    try:
        token = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except OSError as e:
        raise SplitInferError(f"cannot read token file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise SplitInferError(f"token file {path} is not UTF-8 text") from None
    if not token:
        raise SplitInferError(f"token file {path} is empty; put the shared secret in it")
    return token


def token_from_env() -> str | None:
    """``SPLITINFER_TOKEN``, else the contents of ``SPLITINFER_TOKEN_FILE``, else None."""
    if os.environ.get("SPLITINFER_TOKEN"):
        return os.environ["SPLITINFER_TOKEN"]
    if os.environ.get("SPLITINFER_TOKEN_FILE"):
        return read_token_file(os.environ["SPLITINFER_TOKEN_FILE"])
    return None


class WebSocketLink(Link):
    """Synchronous link to a cloud body server at ``ws://HOST:PORT`` or ``wss://HOST:PORT``."""

    reconnectable = True

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        wan: WanProfile | None = None,
        max_frame_bytes: int = DEFAULT_LIMITS.max_frame_bytes,
        open_timeout_s: float = 10.0,
        reply_timeout_s: float | None = 600.0,
        connect_attempts: int = 3,
        reconnect_attempts: int = 8,
        backoff_s: float = 0.2,
        backoff_max_s: float = 3.0,
        ca_file: str | None = None,
    ):
        super().__init__(wan)
        parts = urlsplit(url)
        if parts.scheme not in ("ws", "wss") or not parts.hostname:
            raise SplitInferError(f"bad cloud URL {url!r}: expected ws://HOST:PORT or wss://HOST:PORT")
        try:
            parts.port  # noqa: B018  (urlsplit checks the port only when it is read)
        except ValueError:
            raise SplitInferError(f"bad cloud URL {url!r}: the port must be a number 0-65535, e.g. "
                                  "ws://127.0.0.1:8765") from None
        if connect_attempts < 1 or reconnect_attempts < 1 or backoff_s < 0:
            raise SplitInferError("connect_attempts and reconnect_attempts must be >= 1 and backoff_s >= 0")
        self.url = url
        self.token = token if token is not None else token_from_env()
        self.max_frame_bytes = max_frame_bytes
        self.open_timeout_s, self.reply_timeout_s = open_timeout_s, reply_timeout_s
        self.reconnect_attempts, self.backoff_s, self.backoff_max_s = reconnect_attempts, backoff_s, backoff_max_s
        self.reconnects = 0
        self._ssl = None
        if parts.scheme == "wss":
            if ca_file and not Path(ca_file).is_file():
                raise SplitInferError(f"--tls-ca {ca_file}: no such file; give the PEM file of the CA that signed "
                                      "the server's certificate")
            self._ssl = ssl.create_default_context(cafile=ca_file)
        elif ca_file:
            raise SplitInferError(f"--tls-ca given but the URL {url!r} is not wss://")
        if self.token and parts.scheme == "ws" and parts.hostname not in ("127.0.0.1", "localhost", "::1"):
            log.warning("sending the token over unencrypted ws:// to %s; use wss:// (TLS)", parts.hostname)
        self._ws = None
        self._connect(connect_attempts)

    # ------------------------------------------------------------------ connection
    def _connect_once(self):
        return connect(
            self.url,
            ssl=self._ssl,
            open_timeout=self.open_timeout_s,
            max_size=self.max_frame_bytes + FRAME_SLACK_BYTES,
            compression=None,  # hidden states do not compress; deflate would only cost time
            proxy=None,
            user_agent_header="splitinfer",
            **_LEGACY,
        )

    def _connect(self, attempts: int) -> None:
        """Connect, retrying with exponential backoff; SplitInferError naming the cause when all fail."""
        delay, t0, last = self.backoff_s, time.monotonic(), None
        for i in range(attempts):
            try:
                self._ws = self._connect_once()
                return
            except InvalidURI as e:
                raise SplitInferError(f"bad cloud URL {self.url!r}: {e}") from None
            except ssl.SSLCertVerificationError as e:
                raise SplitInferError(
                    f"TLS certificate of {self.url} not trusted: {e.verify_message}; pass --tls-ca CERT.pem"
                ) from None
            except (OSError, TimeoutError, InvalidHandshake) as e:
                last = e
            if i + 1 < attempts:
                time.sleep(delay)
                delay = min(2 * delay, self.backoff_max_s)
        raise SplitInferError(
            f"cannot connect to the cloud at {self.url} ({attempts} attempt(s) over {time.monotonic() - t0:.1f} s): "
            f"{type(last).__name__}: {last}; is `splitinfer serve` running there?"
        )

    def reconnect(self) -> None:
        """Drop the current connection and connect again (bounded retries with backoff)."""
        self._drop()
        self._connect(self.reconnect_attempts)
        self.reconnects += 1
        log.info("reconnected to %s", self.url)

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                ws.close()
            except Exception:  # already broken: nothing more to release
                pass

    # ------------------------------------------------------------------ exchange
    def _exchange(self, frame: bytes) -> bytes:
        if self._ws is None:
            raise ConnectionLost(f"not connected to {self.url}")
        try:
            self._ws.send(frame)
            reply = self._ws.recv(timeout=self.reply_timeout_s)
        except TimeoutError:
            self._drop()
            raise ConnectionLost(f"no reply from {self.url} within {self.reply_timeout_s} s") from None
        except ConnectionClosed as e:
            self._drop()
            code = e.sent.code if e.sent is not None else (e.rcvd.code if e.rcvd is not None else None)
            reason = (e.rcvd.reason if e.rcvd is not None else "") or (e.sent.reason if e.sent is not None else "")
            if code in (1008, 1009):  # policy violation / message too big: refused on purpose
                raise CloudError(f"the connection to {self.url} was closed ({code}): {reason}") from None
            detail = f"{code or 'no close frame'}{': ' + reason if reason else ''}"
            raise ConnectionLost(f"connection to {self.url} closed ({detail})") from None
        except OSError as e:
            self._drop()
            raise ConnectionLost(f"connection to {self.url} failed: {e}") from None
        if isinstance(reply, str):
            raise ProtocolError("the cloud sent a text message; the protocol uses binary frames")
        return reply

    def close(self) -> None:
        self._drop()
