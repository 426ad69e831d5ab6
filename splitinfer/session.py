"""The cloud body's request handler: sessions, KV caches, validation, limits.

:class:`BodyService` turns one request frame (bytes) into one reply frame
(bytes). It is transport-agnostic: the in-process link calls it directly and
the WebSocket server (:mod:`splitinfer.server`) calls it per message, from
several worker threads at once. Every bad request gets an ``error`` frame
naming the problem; the service itself never raises on wire input.

Thread safety: the session table and the counters are guarded by locks, each
session's cache by its own lock (so one session's frames run one at a time,
different sessions in parallel). Quotas: ``max_sessions`` in all,
``max_sessions_per_owner`` per connection, ``max_context`` positions per
session (checked before a forward or a ``keep`` changes anything, and again by
the cache itself); a session expires after ``idle_timeout_s`` without real
work (a forward, or a commit that changed the cache). A session may carry an
``owner`` (the server passes its connection id): frames naming a session
opened by another owner are refused as unknown (and ``stats`` counts only the
caller's sessions unless ``stats_all``), and :meth:`BodyService.close_owned`
drops all sessions of a closed connection.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field, replace

import torch

from splitinfer import batch_invariant as bi
from splitinfer.batch_scheduler import BatchConfig, BatchScheduler
from splitinfer.body_info import BodyInfo
from splitinfer.decoding.tree import depths, validate_parents
from splitinfer.defenses.pipeline import DefensePipeline, check_public
from splitinfer.errors import ProtocolError, SplitInferError
from splitinfer.kv_cache import PartKVCache
from splitinfer.packed_body import BodyStep
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
    short,
)

log = logging.getLogger(__name__)


@dataclass
class BodySession:
    cache: PartKVCache
    created: float
    last_used: float  # last *real work*: a forward, or a commit that changed the cache
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
    max_sessions_per_owner: int = 8  # per connection (owner None, in-process: no quota)
    stats_all: bool = False  # stats show server-wide figures to every client (operator flag --stats-all)


class BodyService:
    """Runs a :class:`CloudBody` for many sessions, one frame at a time."""

    def __init__(self, body: CloudBody, info: BodyInfo, limits: ServiceLimits = ServiceLimits(),
                 defense: DefensePipeline | None = None, batch: BatchConfig = BatchConfig(max_batch=1)):
        if not isinstance(info, BodyInfo):
            raise TypeError(f"info must be a BodyInfo, got {type(info).__name__}")
        self.info = info
        self.set_defense(defense or DefensePipeline())
        self.limits = limits
        self.sessions: dict[str, BodySession] = {}
        self.last_work: dict[object, float] = {}  # owner -> monotonic time of its last real work
        self._in_flight: dict[object, int] = {}  # owner -> forwards it has in flight
        self._answered: dict[object, float] = {}  # owner -> monotonic time its last forward was answered
        self._lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self.stats = {"requests": 0, "errors": 0, "forwards": 0, "tokens": 0, "sessions_opened": 0}
        self.extra_stats = None  # optional callable -> dict merged into the stats reply (server-level figures)
        param = next(body.parameters())
        self.dtype, self.device = param.dtype, param.device
        if bi.is_enabled(body):  # packed forwards stay within the rows the kernels were probed for
            batch = replace(batch, max_rows=min(batch.max_rows, bi.MAX_ROWS))
        self.scheduler = BatchScheduler(body, batch, self._expected_callers)

    @property
    def body(self) -> CloudBody:
        """The body every forward runs: the scheduler's, so replacing it here replaces it there."""
        return self.scheduler.body

    @body.setter
    def body(self, body: CloudBody) -> None:
        self.scheduler.body = body

    def _expected_callers(self) -> int:
        """Owners whose step the batch scheduler may wait for: a forward in flight, or one answered less than
        the batch window ago (likely to send the next within it). An owner that holds a session and sends
        nothing is not counted, so it makes nobody wait the window (issue 30, finding 4)."""
        recent = time.monotonic() - self.scheduler.config.window_ms / 1e3
        with self._stats_lock:
            owners = {o for o, n in self._in_flight.items() if n > 0}
            owners |= {o for o, t in self._answered.items() if t >= recent}
        return len(owners)

    def _track(self, owner, delta: int) -> None:
        with self._stats_lock:
            n = self._in_flight.get(owner, 0) + delta
            if n > 0:
                self._in_flight[owner] = n
            else:
                self._in_flight.pop(owner, None)
                self._answered[owner] = time.monotonic()

    def set_defense(self, defense: DefensePipeline) -> None:
        """The defense whose cloud side this service runs (decode_up / encode_down); announced at hello."""
        self.defense = defense

    def _defense_label(self) -> str | None:
        """The defense's public part as announced at hello (None: undefended)."""
        return None if self.defense.public_label == "none" else self.defense.public_label

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
            log.info("refused request: %s", str(e)[:200])
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
        self.info.check(f)
        mismatch = check_public(f.get("defense"), self._defense_label())
        if mismatch:
            raise ProtocolError(mismatch)
        welcome = {"protocol": PROTOCOL_VERSION, **self.info.public()}
        if self._defense_label():
            welcome["defense"] = self._defense_label()
        return "welcome", welcome, {}, 0.0

    def _op_open(self, frame, owner=None):
        self.expire_idle()
        quota = self.limits.max_sessions_per_owner
        with self._lock:
            if len(self.sessions) >= self.limits.max_sessions:
                raise ProtocolError(f"server is at its limit of {self.limits.max_sessions} sessions; retry later")
            if owner is not None and sum(s.owner == owner for s in self.sessions.values()) >= quota:
                raise ProtocolError(f"this connection already has its quota of {quota} open sessions "
                                    "(--max-sessions-per-connection); close one first")
            sid = secrets.token_hex(8)
            now = time.monotonic()
            self.sessions[sid] = BodySession(PartKVCache(self.limits.max_context), now, now, owner=owner,
                                             number=self.stats["sessions_opened"])
            self._count(sessions_opened=1)
        return "opened", {"session": sid}, {}, 0.0

    def _session(self, sid: str, owner=None) -> BodySession:
        s = self.sessions.get(sid)
        if s is None or s.owner != owner:
            raise ProtocolError(f"unknown, closed or expired session {short(sid)}; open a new session")
        return s

    def _worked(self, s: BodySession) -> None:
        s.last_used = now = time.monotonic()
        self.last_work[s.owner] = now

    @staticmethod
    def _parse_keep(keep) -> tuple[int, list[int]] | None:
        if keep is None:
            return None
        if not isinstance(keep, dict) or not isinstance(keep.get("prefix"), int) or not isinstance(
            keep.get("accepted"), list
        ):
            raise ProtocolError("'keep' must be {\"prefix\": int, \"accepted\": [int, ...]}")
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in keep["accepted"]):
            raise ProtocolError("'keep.accepted' must hold integers")
        return keep["prefix"], keep["accepted"]

    def _op_forward(self, frame, owner=None):
        self._track(owner, +1)
        try:
            return self._forward(frame, owner)
        finally:
            self._track(owner, -1)

    def _forward(self, frame, owner=None):
        f = frame.fields
        s = self._session(f["session"], owner)
        hidden = self.defense.decode_up(frame.tensors, self.info.hidden_size)
        if hidden is None:
            raise ProtocolError("forward frame carries no 'hidden' tensor")
        positions, parents = f["positions"], f.get("parents")
        d = self.info.hidden_size
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
        keep = self._parse_keep(f.get("keep"))
        with s.lock:  # every check before any change: a refused forward leaves the cache as it was
            base = len(s.cache) if keep is None else PartKVCache.check_keep(len(s.cache), *keep)
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
            if keep is not None:
                s.cache.keep(*keep)
            t0 = time.perf_counter()
            cast = hidden.to(self.device, self.dtype)
            if cast.dtype != hidden.dtype and not bool(torch.isfinite(cast).all()):  # finite, but not in this dtype
                raise ProtocolError(
                    f"hidden holds values beyond the range of the body's dtype {str(self.dtype).removeprefix('torch.')}"
                    f" (largest finite {torch.finfo(self.dtype).max:.4g}); send hidden states of a real forward"
                )
            step = BodyStep(cast, torch.tensor(positions, dtype=torch.long), s.cache, parents)
            try:
                done = self.scheduler.run(step)  # alone, or packed with other sessions' steps
            except BaseException:
                s.cache.crop(base)  # drop whatever the layers that ran appended
                raise
            out = done.out.to(hidden.dtype)  # reply in the dtype the client chose for the wire
            compute_s = time.perf_counter() - t0  # queue + forward: this step's time in the body stage
            s.forwards += 1
            self._worked(s)
        self._count(forwards=1, tokens=len(positions))
        reply = self.defense.encode_down(out, positions, s.number)
        fields = {"session": f["session"], "length": len(s.cache)}
        if self.scheduler.config.max_batch > 1 and self.limits.stats_all:  # other tenants' activity: operator only
            fields["batch"] = done.batch  # steps in the forward that computed this one
        return "result", fields, reply, compute_s

    def _op_commit(self, frame, owner=None):
        f = frame.fields
        s = self._session(f["session"], owner)
        with s.lock:
            before = len(s.cache)
            if "crop" in f:
                if not isinstance(f["crop"], int) or isinstance(f["crop"], bool):
                    raise ProtocolError("'crop' must be an integer length")
                if not 0 <= f["crop"] <= before:
                    raise ProtocolError(f"cannot crop a KV cache of {before} entries to {short(f['crop'])}")
                s.cache.crop(f["crop"])
            else:
                keep = self._parse_keep(f.get("keep"))
                if keep is not None:
                    s.cache.keep(*keep)
            if len(s.cache) != before:  # only a commit that changed something counts as activity
                self._worked(s)
        return "committed", {"session": f["session"], "length": len(s.cache)}, {}, 0.0

    def _op_close(self, frame, owner=None):
        sid = frame.fields["session"]
        with self._lock:
            s = self.sessions.get(sid)
            if s is None or s.owner != owner:
                raise ProtocolError(f"unknown, closed or expired session {short(sid)}")
            del self.sessions[sid]
        return "closed", {"session": sid}, {}, 0.0

    def _op_stats(self, frame, owner=None):
        """Figures for the caller's own sessions; server-wide ones only with ``stats_all`` (operator flag)."""
        self.expire_idle()
        everyone = self.limits.stats_all
        mine = [s for s in list(self.sessions.values()) if everyone or s.owner == owner]
        kv = 0
        for s in mine:  # other threads may be growing these caches: snapshot each dict
            tensors = list(s.cache.keys.values()) + list(s.cache.values.values())
            kv += sum(t.numel() * t.element_size() for t in tensors)
        fields = {"sessions": len(mine), "kv_bytes": kv, "scope": "server" if everyone else "connection",
                  "max_context": self.limits.max_context, **self.info.public()}
        if everyone:
            with self._stats_lock:
                fields.update(self.stats)
            fields.update({f"batch_{k}": v for k, v in self.scheduler.counts.items()})
            fields["compute_thread"] = self.scheduler.compute_thread  # None until the first batched step
            fields["model"] = self.info.model
        extra = self.extra_stats(everyone) if self.extra_stats is not None else {}
        return "stats_reply", {**fields, **extra}, {}, 0.0

    # ---------------------------------------------------------------- housekeeping
    def close_owned(self, owner: object) -> int:
        """Drop every session opened by ``owner`` (a closed connection); return how many."""
        with self._lock:
            mine = [sid for sid, s in self.sessions.items() if s.owner == owner]
            for sid in mine:
                del self.sessions[sid]
            self.last_work.pop(owner, None)
        with self._stats_lock:
            self._answered.pop(owner, None)
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
