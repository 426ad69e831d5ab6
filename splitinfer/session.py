"""The cloud body's request handler: sessions, KV caches, validation, limits.

:class:`BodyService` turns one request frame (bytes) into one reply frame
(bytes). It is transport-agnostic: the in-process link calls it directly and
the WebSocket server (:mod:`splitinfer.server`) calls it per message, from
several worker threads at once. Every bad request gets an ``error`` frame
naming the problem; the service itself never raises on wire input.

Thread safety: the session table and the counters are guarded by locks, each
session's cache by its own lock (so one session's frames run one at a time,
different sessions in parallel). A session may carry an ``owner`` (the
server passes its connection id): frames naming a session opened by another
owner are refused as unknown, and :meth:`BodyService.close_owned` drops all
sessions of a closed connection.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field

import torch

from splitinfer.decoding.tree import depths, validate_parents
from splitinfer.defenses.pipeline import DefensePipeline, check_public
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
    owner: object = None  # who opened it (the server's connection id); None in-process
    number: int = 0  # the service's session counter: keys the defense's reply noise
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class ServiceLimits:
    max_sessions: int = 64
    max_context: int = 4096
    idle_timeout_s: float = 300.0
    frame: Limits = DEFAULT_LIMITS


class BodyService:
    """Runs a :class:`CloudBody` for many sessions, one frame at a time."""

    def __init__(self, body: CloudBody, info: dict, limits: ServiceLimits = ServiceLimits(),
                 defense: DefensePipeline | None = None):
        self.body = body
        self.info = dict(info)  # body_sha256, hidden_size, split, num_layers, model
        self.set_defense(defense or DefensePipeline())
        self.limits = limits
        self.sessions: dict[str, BodySession] = {}
        self._lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self.stats = {"requests": 0, "errors": 0, "forwards": 0, "tokens": 0, "sessions_opened": 0}
        self.extra_stats = None  # optional callable -> dict merged into the stats reply (server-level figures)
        param = next(body.parameters())
        self.dtype, self.device = param.dtype, param.device

    def set_defense(self, defense: DefensePipeline) -> None:
        """The defense whose cloud side this service runs (decode_up / encode_down); announced at hello."""
        self.defense = defense
        self.info.pop("defense", None)
        if defense.public_label != "none":
            self.info["defense"] = defense.public_label

    # ---------------------------------------------------------------- entry
    def _count(self, **increments: int) -> None:
        with self._stats_lock:
            for key, n in increments.items():
                self.stats[key] += n

    def handle(self, data: bytes, owner: object = None) -> bytes:
        """Decode a request, run it, encode the reply. Never raises on bad input.

        ``owner`` identifies the caller (a connection); sessions are visible
        only to the owner that opened them.
        """
        t0 = time.perf_counter()
        self._count(requests=1)
        try:
            frame = decode_frame(data, self.limits.frame)
            t1 = time.perf_counter()
            handler = getattr(self, f"_op_{frame.op}", None)
            if handler is None:
                raise ProtocolError(f"op {frame.op!r} is not a request the cloud body accepts")
            op, fields, tensors, compute_s = handler(frame, owner)
            t2 = time.perf_counter()
            encoded = encode_tensors(tensors)
            if op == "result":  # server-side timing, so the client can split its round trip into parts
                t3 = time.perf_counter()
                fields = {**fields, "server_ms": {"decode": 1e3 * (t1 - t0), "body": 1e3 * compute_s,
                                                  "encode": 1e3 * (t3 - t2)}}
            reply = encode_frame(op, fields, encoded=encoded)
            return reply
        except SplitInferError as e:  # ProtocolError is one
            self._count(errors=1)
            log.info("refused request: %s", e)
            return error_frame(str(e))
        except Exception as e:  # a bug, not bad input: report, keep serving
            self._count(errors=1)
            log.exception("internal error while handling a frame")
            return error_frame(f"internal server error: {type(e).__name__}: {e}")

    # ---------------------------------------------------------------- ops
    def _op_hello(self, frame, owner=None):
        f = frame.fields
        if f["protocol"] != PROTOCOL_VERSION:
            raise ProtocolError(f"client speaks protocol {f['protocol']}, server speaks {PROTOCOL_VERSION}")
        for key in ("body_sha256", "hidden_size", "split", "batch_invariant"):
            want = f.get(key)
            if want is not None and want != self.info.get(key, False if key == "batch_invariant" else None):
                hint = {"hidden_size": "", "batch_invariant": " (start the server with --batch-invariant)"}.get(
                    key, " (start the server with the same --model, --split and --dtype)")
                raise ProtocolError(
                    f"{key} mismatch: client expects {want!r}, this server has {self.info.get(key)!r}{hint}")
        mismatch = check_public(f.get("defense"), self.info.get("defense"))
        if mismatch:
            raise ProtocolError(mismatch)
        return "welcome", {"protocol": PROTOCOL_VERSION, **self.info}, {}, 0.0

    def _op_open(self, frame, owner=None):
        self.expire_idle()
        with self._lock:
            if len(self.sessions) >= self.limits.max_sessions:
                raise ProtocolError(f"server is at its limit of {self.limits.max_sessions} sessions; retry later")
            sid = secrets.token_hex(8)
            now = time.monotonic()
            self.sessions[sid] = BodySession(PartKVCache(), now, now, owner=owner, number=self.stats["sessions_opened"])
            self._count(sessions_opened=1)
        return "opened", {"session": sid}, {}, 0.0

    def _session(self, sid: str, owner=None) -> BodySession:
        s = self.sessions.get(sid)
        if s is None or s.owner != owner:
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

    def _op_forward(self, frame, owner=None):
        f = frame.fields
        s = self._session(f["session"], owner)
        hidden = self.defense.decode_up(frame.tensors, self.info["hidden_size"])
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
            s.last_used = time.monotonic()
        self._count(forwards=1, tokens=len(positions))
        reply = self.defense.encode_down(out, positions, s.number)
        return "result", {"session": f["session"], "length": len(s.cache)}, reply, compute_s

    def _op_commit(self, frame, owner=None):
        f = frame.fields
        s = self._session(f["session"], owner)
        with s.lock:
            if "crop" in f:
                if not isinstance(f["crop"], int) or isinstance(f["crop"], bool):
                    raise ProtocolError("'crop' must be an integer length")
                s.cache.crop(f["crop"])
            else:
                self._apply_keep(s, f.get("keep"))
        return "committed", {"session": f["session"], "length": len(s.cache)}, {}, 0.0

    def _op_close(self, frame, owner=None):
        sid = frame.fields["session"]
        with self._lock:
            s = self.sessions.get(sid)
            if s is None or s.owner != owner:
                raise ProtocolError(f"unknown, closed or expired session {sid!r}")
            del self.sessions[sid]
        return "closed", {"session": sid}, {}, 0.0

    def _op_stats(self, frame, owner=None):
        self.expire_idle()
        kv = 0
        for s in list(self.sessions.values()):  # other threads may be growing these caches: snapshot each dict
            tensors = list(s.cache.keys.values()) + list(s.cache.values.values())
            kv += sum(t.numel() * t.element_size() for t in tensors)
        with self._stats_lock:
            counters = dict(self.stats)
        extra = self.extra_stats() if self.extra_stats is not None else {}
        fields = {**counters, "sessions": len(self.sessions), "kv_bytes": kv, **self.info, **extra}
        return "stats_reply", fields, {}, 0.0

    # ---------------------------------------------------------------- housekeeping
    def close_owned(self, owner: object) -> int:
        """Drop every session opened by ``owner`` (a closed connection); return how many."""
        with self._lock:
            mine = [sid for sid, s in self.sessions.items() if s.owner == owner]
            for sid in mine:
                del self.sessions[sid]
        return len(mine)

    def expire_idle(self) -> int:
        """Drop sessions idle for longer than the timeout (never one mid-request); return how many."""
        cutoff = time.monotonic() - self.limits.idle_timeout_s
        with self._lock:
            stale = [sid for sid, s in self.sessions.items() if s.last_used < cutoff and not s.lock.locked()]
            for sid in stale:
                del self.sessions[sid]
        if stale:
            log.info("expired %d idle session(s)", len(stale))
        return len(stale)
