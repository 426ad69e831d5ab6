"""The cloud body's request handler: sessions, KV caches, validation, limits.

:class:`BodyService` turns one request frame (bytes) into one reply frame
(bytes). It is transport-agnostic: the in-process link calls it directly and
the WebSocket server (:mod:`splitinfer.server`) calls it per message. Every
bad request gets an ``error`` frame naming the problem; the service itself
never raises on wire input.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field

import torch

from splitinfer.decoding.tree import depths, validate_parents
from splitinfer.errors import ProtocolError, SplitInferError
from splitinfer.kv_cache import PartKVCache
from splitinfer.partition import CloudBody
from splitinfer.protocol import (
    DEFAULT_LIMITS,
    PROTOCOL_VERSION,
    Limits,
    decode_frame,
    encode_frame,
    encode_tensors,
    error_frame,
    require_finite,
)

log = logging.getLogger(__name__)


@dataclass
class BodySession:
    cache: PartKVCache
    created: float
    last_used: float
    forwards: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class ServiceLimits:
    max_sessions: int = 64
    max_context: int = 4096
    idle_timeout_s: float = 300.0
    frame: Limits = DEFAULT_LIMITS


class BodyService:
    """Runs a :class:`CloudBody` for many sessions, one frame at a time."""

    def __init__(self, body: CloudBody, info: dict, limits: ServiceLimits = ServiceLimits()):
        self.body = body
        self.info = dict(info)  # body_sha256, hidden_size, split, num_layers, model
        self.limits = limits
        self.sessions: dict[str, BodySession] = {}
        self._lock = threading.Lock()
        self.stats = {"requests": 0, "errors": 0, "forwards": 0, "tokens": 0, "sessions_opened": 0}
        param = next(body.parameters())
        self.dtype, self.device = param.dtype, param.device

    # ---------------------------------------------------------------- entry
    def handle(self, data: bytes) -> bytes:
        """Decode a request, run it, encode the reply. Never raises on bad input."""
        t0 = time.perf_counter()
        self.stats["requests"] += 1
        try:
            frame = decode_frame(data, self.limits.frame)
            t1 = time.perf_counter()
            handler = getattr(self, f"_op_{frame.op}", None)
            if handler is None:
                raise ProtocolError(f"op {frame.op!r} is not a request the cloud body accepts")
            op, fields, tensors, compute_s = handler(frame)
            t2 = time.perf_counter()
            encoded = encode_tensors(tensors)
            if op == "result":  # server-side timing, so the client can split its round trip into parts
                t3 = time.perf_counter()
                fields = {**fields, "server_ms": {"decode": 1e3 * (t1 - t0), "body": 1e3 * compute_s,
                                                  "encode": 1e3 * (t3 - t2)}}
            reply = encode_frame(op, fields, encoded=encoded)
            return reply
        except SplitInferError as e:  # ProtocolError is one
            self.stats["errors"] += 1
            log.info("refused request: %s", e)
            return error_frame(str(e))
        except Exception as e:  # a bug, not bad input: report, keep serving
            self.stats["errors"] += 1
            log.exception("internal error while handling a frame")
            return error_frame(f"internal server error: {type(e).__name__}: {e}")

    # ---------------------------------------------------------------- ops
    def _op_hello(self, frame):
        f = frame.fields
        if f["protocol"] != PROTOCOL_VERSION:
            raise ProtocolError(f"client speaks protocol {f['protocol']}, server speaks {PROTOCOL_VERSION}")
        for key in ("body_sha256", "hidden_size", "split"):
            want = f.get(key)
            if want is not None and want != self.info.get(key):
                raise ProtocolError(
                    f"{key} mismatch: client expects {want!r}, this server has {self.info.get(key)!r}"
                    + (" (start the server with the same --model and --split)" if key != "hidden_size" else "")
                )
        return "welcome", {"protocol": PROTOCOL_VERSION, **self.info}, {}, 0.0

    def _op_open(self, frame):
        self.expire_idle()
        with self._lock:
            if len(self.sessions) >= self.limits.max_sessions:
                raise ProtocolError(f"server is at its limit of {self.limits.max_sessions} sessions; retry later")
            sid = secrets.token_hex(8)
            now = time.monotonic()
            self.sessions[sid] = BodySession(PartKVCache(), now, now)
            self.stats["sessions_opened"] += 1
        return "opened", {"session": sid}, {}, 0.0

    def _session(self, sid: str) -> BodySession:
        s = self.sessions.get(sid)
        if s is None:
            raise ProtocolError(f"unknown, closed or expired session {sid!r}; open a new session")
        s.last_used = time.monotonic()
        return s

    def _apply_keep(self, s: BodySession, keep) -> None:
        if keep is None:
            return
        if not isinstance(keep, dict) or not isinstance(keep.get("prefix"), int) or not isinstance(
            keep.get("accepted"), list
        ):
            raise ProtocolError("'keep' must be {\"prefix\": int, \"accepted\": [int, ...]}")
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in keep["accepted"]):
            raise ProtocolError("'keep.accepted' must hold integers")
        s.cache.keep(keep["prefix"], keep["accepted"])

    def _op_forward(self, frame):
        f = frame.fields
        s = self._session(f["session"])
        hidden = frame.tensors.get("hidden")
        if hidden is None:
            raise ProtocolError("forward frame carries no 'hidden' tensor")
        positions, parents = f["positions"], f.get("parents")
        d = self.info["hidden_size"]
        if hidden.dim() != 3 or hidden.shape[0] != 1 or hidden.shape[2] != d or hidden.shape[1] != len(positions):
            raise ProtocolError(
                f"hidden has shape {list(hidden.shape)}; expected [1, {len(positions)}, {d}] "
                "(batch 1, one row per position, the model's hidden size)"
            )
        if not positions:
            raise ProtocolError("forward frame has no positions")
        if not hidden.is_floating_point():
            raise ProtocolError(f"hidden must be a floating tensor, got {hidden.dtype}")
        require_finite(hidden, "hidden")
        with s.lock:
            self._apply_keep(s, f.get("keep"))
            base = len(s.cache)
            if parents is None:
                expected = list(range(base, base + len(positions)))
            else:
                validate_parents(parents, len(positions))
                expected = [base + dp for dp in depths(parents)]
            if positions != expected:
                raise ProtocolError(
                    f"positions {positions[:8]}{'...' if len(positions) > 8 else ''} do not continue the "
                    f"session's {base} cached positions; expected {expected[:8]}"
                )
            if base + len(positions) > self.limits.max_context:
                raise ProtocolError(
                    f"context of {base + len(positions)} tokens exceeds the server's --max-context "
                    f"{self.limits.max_context}"
                )
            t0 = time.perf_counter()
            out = self.body(
                hidden.to(self.device, self.dtype), torch.tensor(positions, dtype=torch.long), s.cache, parents
            )
            out = out.to(hidden.dtype)  # reply in the dtype the client chose for the wire
            compute_s = time.perf_counter() - t0
            s.forwards += 1
        self.stats["forwards"] += 1
        self.stats["tokens"] += len(positions)
        return "result", {"session": f["session"], "length": len(s.cache)}, {"hidden": out}, compute_s

    def _op_commit(self, frame):
        f = frame.fields
        s = self._session(f["session"])
        with s.lock:
            if "crop" in f:
                if not isinstance(f["crop"], int) or isinstance(f["crop"], bool):
                    raise ProtocolError("'crop' must be an integer length")
                s.cache.crop(f["crop"])
            else:
                self._apply_keep(s, f.get("keep"))
        return "committed", {"session": f["session"], "length": len(s.cache)}, {}, 0.0

    def _op_close(self, frame):
        sid = frame.fields["session"]
        with self._lock:
            if self.sessions.pop(sid, None) is None:
                raise ProtocolError(f"unknown, closed or expired session {sid!r}")
        return "closed", {"session": sid}, {}, 0.0

    def _op_stats(self, frame):
        self.expire_idle()
        kv = sum(s.cache.nbytes() for s in list(self.sessions.values()))
        return "stats_reply", {**self.stats, "sessions": len(self.sessions), "kv_bytes": kv, **self.info}, {}, 0.0

    # ---------------------------------------------------------------- housekeeping
    def expire_idle(self) -> int:
        """Drop sessions idle for longer than the timeout; return how many."""
        cutoff = time.monotonic() - self.limits.idle_timeout_s
        with self._lock:
            stale = [sid for sid, s in self.sessions.items() if s.last_used < cutoff]
            for sid in stale:
                del self.sessions[sid]
        if stale:
            log.info("expired %d idle session(s)", len(stale))
        return len(stale)
