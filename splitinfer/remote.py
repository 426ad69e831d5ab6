"""The local side's view of the cloud body: protocol calls over a :class:`~splitinfer.link.Link`.

:class:`RemoteBody` sends hello/open/forward/commit/close frames and checks
every reply from the (untrusted) cloud: op, session, shape, dtype and finite
values. A bad reply raises :class:`SplitInferError` instead of producing
garbage tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from splitinfer.errors import ProtocolError, SplitInferError
from splitinfer.link import Link
from splitinfer.protocol import PROTOCOL_VERSION, decode_frame, encode_frame, encode_tensors, require_finite


class CloudError(SplitInferError):
    """The cloud refused a request or sent an invalid reply."""


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

    def __init__(self, link: Link, expect: dict | None = None):
        self.link = link
        self.expect = dict(expect or {})  # body_sha256 / hidden_size / split the client requires
        self.session: str | None = None
        self.server_info: dict = {}

    def _call(self, op: str, fields: dict | None = None, tensors=None, encoded=None):
        frame = encode_frame(op, fields, tensors, encoded=encoded)
        t0 = time.perf_counter()
        reply_bytes = self.link.request(frame)
        wall = time.perf_counter() - t0
        try:
            reply = decode_frame(reply_bytes)
        except ProtocolError as e:
            raise CloudError(f"the cloud sent an invalid frame in reply to {op!r}: {e}") from None
        if reply.op == "error":
            raise CloudError(f"the cloud refused {op!r}: {reply.fields.get('message')}")
        return reply, frame, reply_bytes, wall

    def hello(self) -> dict:
        reply, *_ = self._call("hello", {"protocol": PROTOCOL_VERSION, **self.expect})
        if reply.op != "welcome":
            raise CloudError(f"expected 'welcome' in reply to hello, got {reply.op!r}")
        self.server_info = reply.fields
        return reply.fields

    def open(self) -> str:
        reply, *_ = self._call("open")
        if reply.op != "opened":
            raise CloudError(f"expected 'opened', got {reply.op!r}")
        self.session = reply.fields["session"]
        return self.session

    def forward(
        self,
        hidden: torch.Tensor,  # (1, T, d) on the wire dtype already
        positions: list[int],
        parents: list[int] | None = None,
        keep: dict | None = None,
    ) -> tuple[torch.Tensor, ForwardTiming]:  # (1, T, d), timing
        if self.session is None:
            raise SplitInferError("no cloud session is open; call open() first")
        t0 = time.perf_counter()
        fields = {"session": self.session, "positions": positions}
        if parents is not None:
            fields["parents"] = parents
        if keep is not None:
            fields["keep"] = keep
        encoded = encode_tensors({"hidden": hidden})
        t1 = time.perf_counter()
        reply, frame, reply_bytes, wall = self._call("forward", fields, encoded=encoded)
        t2 = time.perf_counter()
        if reply.op != "result" or reply.fields.get("session") != self.session:
            raise CloudError(f"expected a 'result' for session {self.session}, got {reply.op!r}")
        out = reply.tensors.get("hidden")
        if out is None or list(out.shape) != list(hidden.shape):
            got = None if out is None else list(out.shape)
            raise CloudError(f"the cloud returned hidden states of shape {got}; expected {list(hidden.shape)}")
        if out.dtype != hidden.dtype:
            raise CloudError(f"the cloud returned dtype {out.dtype}; expected {hidden.dtype}")
        try:
            require_finite(out, "the cloud's hidden states")
        except ProtocolError as e:
            raise CloudError(str(e)) from None
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

    def commit(self, keep: dict | None = None, crop: int | None = None) -> int:
        fields: dict = {"session": self.session}
        if crop is not None:
            fields["crop"] = crop
        if keep is not None:
            fields["keep"] = keep
        reply, *_ = self._call("commit", fields)
        return int(reply.fields["length"])

    def close(self) -> None:
        if self.session is not None:
            try:
                self._call("close", {"session": self.session})
            finally:
                self.session = None
