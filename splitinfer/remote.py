"""The local side's view of the cloud body: protocol calls over a :class:`~splitinfer.link.Link`.

:class:`RemoteBody` sends hello/open/forward/commit/close frames and checks
every reply from the (untrusted) cloud: op, session, shape, dtype and finite
values. A bad reply raises :class:`SplitInferError` instead of producing
garbage tokens.

Fault handling: over a link that can reconnect (``link.reconnectable``, e.g.
:class:`~splitinfer.ws_link.WebSocketLink`) it keeps a
:class:`~splitinfer.replay_log.ReplayLog` of the committed hidden states it has
sent. When the link reports :class:`ConnectionLost` (dropped connection,
restarted server), it reconnects (the link's bounded retries with backoff),
says hello again (the server must still have the same body), opens a new
session, replays the log in one causal forward to rebuild the body's KV
cache, and re-sends the interrupted request. Bounded: after
``max_recoveries`` failed recoveries it raises :class:`CloudError`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from splitinfer.defenses.pipeline import DefensePipeline, check_public
from splitinfer.errors import ProtocolError, SplitInferError
from splitinfer.link import Link
from splitinfer.protocol import PROTOCOL_VERSION, decode_frame, encode_frame, encode_tensors, require_finite
from splitinfer.replay_log import ReplayLog

log = logging.getLogger(__name__)

REPLAY_FRAME_BYTES = 16 * 2**20  # replay the log in forwards of at most this many hidden-state bytes


class CloudError(SplitInferError):
    """The cloud refused a request or sent an invalid reply."""


class ConnectionLost(SplitInferError):
    """The link to the cloud dropped; raised by reconnectable links so :class:`RemoteBody` can recover."""


@dataclass
class ForwardTiming:
    """Milliseconds of one forward round trip, split by where the time went."""

    encode_ms: float = 0.0  # client: cast + serialise
    decode_ms: float = 0.0  # client: parse + check reply
    server_codec_ms: float = 0.0  # server: decode request + encode reply
    body_ms: float = 0.0  # server: body layers
    network_ms: float = 0.0  # round trip wall time minus the server's share
    bytes_up: int = 0
    bytes_down: int = 0


class RemoteBody:
    """Protocol client for one cloud session over a link."""

    def __init__(self, link: Link, expect: dict | None = None, *, replay: bool | None = None, max_recoveries: int = 3,
                 defense: DefensePipeline | None = None):
        self.link = link
        self.defense = defense or DefensePipeline()  # its codec (quant) runs where the bytes leave
        self.session_no = -1  # the client's own session counter: keys the defense's noise draws
        self.expect = dict(expect or {})  # body_sha256 / hidden_size / split the client requires
        self.session: str | None = None
        self.server_info: dict = {}
        self.reconnectable = bool(getattr(link, "reconnectable", False))
        keep_log = self.reconnectable if replay is None else replay
        self.log: ReplayLog | None = ReplayLog() if keep_log else None
        self.max_recoveries = max_recoveries
        self.recoveries = 0  # successful recoveries so far (for reports and tests)

    def _call(self, op: str, fields: dict | None = None, tensors=None, encoded=None):
        frame = encode_frame(op, fields, tensors, encoded=encoded)
        t0 = time.perf_counter()
        reply_bytes = self.link.request(frame)  # may raise ConnectionLost
        wall = time.perf_counter() - t0
        try:
            reply = decode_frame(reply_bytes)
        except ProtocolError as e:
            raise CloudError(f"the cloud sent an invalid frame in reply to {op!r}: {e}") from None
        if reply.op == "error":
            raise CloudError(f"the cloud refused {op!r}: {reply.fields.get('message')}")
        return reply, frame, reply_bytes, wall

    # ------------------------------------------------------------------ recovery
    def _retrying(self, attempt):
        """Run ``attempt(recovered: bool)``; on ConnectionLost recover and retry (bounded)."""
        recovered = False
        while True:
            try:
                return attempt(recovered)
            except ConnectionLost as e:
                self._recover(e)
                recovered = True

    def _recover(self, err: ConnectionLost) -> None:
        """Reconnect, hello, re-open the session and replay the log; raise CloudError if impossible."""
        if not self.reconnectable:
            raise CloudError(f"lost the connection to the cloud: {err}") from None
        had_session = self.session is not None
        if had_session and self.log is None:
            raise CloudError(f"lost the connection to the cloud mid-session (replay is off): {err}") from None
        if had_session and self.log.broken:
            raise CloudError(f"lost the connection to the cloud and cannot rebuild its cache: {self.log.broken}")
        for attempt in range(1, self.max_recoveries + 1):
            log.warning("connection to the cloud lost (%s); reconnecting (attempt %d/%d)", err, attempt,
                        self.max_recoveries)
            try:
                self.link.reconnect()  # bounded retries with backoff; raises SplitInferError when it gives up
                self._hello_once()
                if had_session:
                    self._open_once()
                    for hidden, positions in self.log.replay_chunks(REPLAY_FRAME_BYTES):
                        self._forward_once(hidden, positions, None, None)
                    log.warning("rebuilt the cloud session: replayed %d positions", self.log.length)
                self.recoveries += 1
                return
            except ConnectionLost as e:
                err = e
        raise CloudError(f"lost the connection to the cloud and gave up after {self.max_recoveries} recoveries: {err}")

    # ------------------------------------------------------------------ operations
    def _hello_once(self) -> dict:
        fields = {"protocol": PROTOCOL_VERSION, **self.expect}
        if self.defense.public_label != "none":
            fields["defense"] = self.defense.public_label
        token = getattr(self.link, "token", None)
        if token:
            fields["token"] = token
        reply, *_ = self._call("hello", fields)
        if reply.op != "welcome":
            raise CloudError(f"expected 'welcome' in reply to hello, got {reply.op!r}")
        mismatch = check_public(self.defense.public_label, reply.fields.get("defense"))
        if mismatch:
            raise CloudError(mismatch)
        self.server_info = reply.fields
        return reply.fields

    def hello(self) -> dict:
        """Check protocol version and body identity (and present the link's token, if any)."""
        return self._retrying(lambda recovered: self.server_info if recovered else self._hello_once())

    def _open_once(self) -> str:
        reply, *_ = self._call("open")
        if reply.op != "opened":
            raise CloudError(f"expected 'opened', got {reply.op!r}")
        self.session = reply.fields["session"]
        return self.session

    def open(self) -> str:
        """Open a new cloud session (one KV cache)."""
        if self.log is not None:
            self.log.reset()
        self.session = None
        self.session_no += 1
        return self._retrying(lambda recovered: self.session if recovered and self.session else self._open_once())

    def forward(
        self,
        hidden: torch.Tensor,  # (1, T, d) on the wire dtype already
        positions: list[int],
        parents: list[int] | None = None,
        keep: dict | None = None,
    ) -> tuple[torch.Tensor, ForwardTiming]:  # (1, T, d), timing
        if self.session is None:
            raise SplitInferError("no cloud session is open; call open() first")
        if self.log is not None:
            self.log.before_forward(keep)  # the log now mirrors the cache this forward runs on
        t0 = time.perf_counter()
        encoded = encode_tensors(self.defense.encode_up(hidden))
        t1 = time.perf_counter()
        # After a recovery the replayed cache already reflects ``keep``: resend without it.
        out, (reply, frame, reply_bytes, wall), t2 = self._retrying(
            lambda recovered: self._forward_once(hidden, positions, parents, None if recovered else keep, encoded)
        )
        if self.log is not None:
            self.log.after_forward(hidden, positions, parents)
        t3 = time.perf_counter()
        server = reply.fields.get("server_ms") or {}
        s_codec = float(server.get("decode", 0.0)) + float(server.get("encode", 0.0))
        s_body = float(server.get("body", 0.0))
        timing = ForwardTiming(
            encode_ms=1e3 * (t1 - t0),
            decode_ms=1e3 * (t3 - t2),
            server_codec_ms=s_codec,
            body_ms=s_body,
            network_ms=max(0.0, 1e3 * wall - s_codec - s_body),
            bytes_up=len(frame),
            bytes_down=len(reply_bytes),
        )
        return out, timing

    def _forward_once(self, hidden, positions, parents, keep, encoded=None):
        """One forward round trip and the checks of its reply; no recovery, no logging."""
        fields = {"session": self.session, "positions": list(positions)}
        if parents is not None:
            fields["parents"] = parents
        if keep is not None:
            fields["keep"] = keep
        if encoded is None:
            encoded = encode_tensors(self.defense.encode_up(hidden))
        reply, frame, reply_bytes, wall = self._call("forward", fields, encoded=encoded)
        t2 = time.perf_counter()
        if reply.op != "result" or reply.fields.get("session") != self.session:
            raise CloudError(f"expected a 'result' for session {self.session}, got {reply.op!r}")
        try:
            out = self.defense.decode_down(reply.tensors, hidden.shape[-1])
        except ProtocolError as e:
            raise CloudError(f"the cloud sent an invalid reply: {e}") from None
        if out is None or list(out.shape) != list(hidden.shape):
            got = None if out is None else list(out.shape)
            raise CloudError(f"the cloud returned hidden states of shape {got}; expected {list(hidden.shape)}")
        if out.dtype != self.defense.down_dtype(hidden.dtype):
            raise CloudError(f"the cloud returned dtype {out.dtype}; expected {self.defense.down_dtype(hidden.dtype)}")
        try:
            require_finite(out, "the cloud's hidden states")
        except ProtocolError as e:
            if hidden.dtype == torch.float16:  # a finite state beyond fp16's 65,504 (Gemma's BOS state) becomes inf
                raise CloudError(f"{e}: the model's states overflow the fp16 wire (65,504 at most; Gemma's reach "
                                 "far beyond); use --wire-dtype bf16 or fp32") from None
            raise CloudError(str(e)) from None
        server = reply.fields.get("server_ms")
        if server is not None and (
            not isinstance(server, dict) or not all(isinstance(v, (int, float)) for v in server.values())
        ):
            raise CloudError(f"the cloud sent a malformed 'server_ms' field: {str(server)[:80]}")
        return out, (reply, frame, reply_bytes, wall), t2

    def commit(self, keep: dict | None = None, crop: int | None = None) -> int:
        """Keep an accepted path and/or crop the body cache; returns its new length."""
        if self.log is not None:
            if crop is not None:
                self.log.crop(crop)
            elif keep is not None:
                self.log.keep(keep["prefix"], keep["accepted"])

        def attempt(recovered: bool) -> int:
            fields: dict = {"session": self.session}
            if recovered:  # the replayed cache already reflects this commit; just confirm its length
                fields["crop"] = self.log.length
            elif crop is not None:
                fields["crop"] = crop
            elif keep is not None:
                fields["keep"] = keep
            reply, *_ = self._call("commit", fields)
            if reply.op != "committed" or reply.fields.get("session") != self.session:
                raise CloudError(f"expected 'committed' for session {self.session}, got {reply.op!r}")
            return int(reply.fields["length"])

        return self._retrying(attempt)

    def close(self) -> None:
        """Close the session (a dropped connection has closed it already: then this is a no-op)."""
        if self.session is not None:
            try:
                self._call("close", {"session": self.session})
            except ConnectionLost as e:
                log.info("connection lost while closing session %s (the server drops it): %s", self.session, e)
            finally:
                self.session = None
                if self.log is not None:
                    self.log.reset()
