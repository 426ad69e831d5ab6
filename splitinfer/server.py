"""The cloud body as a network service: ``splitinfer serve``.

An asyncio WebSocket server (the ``websockets`` package) carrying the binary
frames of :mod:`splitinfer.protocol` to a :class:`~splitinfer.session.BodyService`.

- **Body only.** :func:`load_body` builds the body from ``config.json`` and the
  body layers' safetensors (:meth:`CloudBody.from_weights`); the process never
  holds the embedding matrix or the LM head. The ``stats`` reply lists the
  loaded modules and parameter count so a client can check that.
- **Handshake.** The first frame of a connection must be ``hello`` within
  ``hello_timeout_s``; it carries the shared-secret ``token`` when one is
  configured (compared with :func:`hmac.compare_digest`). Any other first
  frame, a wrong token, or a body mismatch gets an error frame and the
  connection is closed (code 1008).
- **Compute off the event loop.** Every request runs in a thread pool; each
  session has its own lock in the service, so the loop keeps answering pings
  and other clients while a body forward runs.
- **Limits.** ``max_size`` of websockets is the frame limit plus 1 MiB: a frame a
  little over the limit gets an error frame from the codec, a much larger one
  is cut off by websockets (close code 1009) before it is buffered. Stalled
  clients: the opening handshake must finish within ``open_timeout_s``, hello
  must follow within ``hello_timeout_s``, and a client that stops answering
  keepalive pings (for instance one that sent half a frame and stalls) is
  dropped after ``ping_interval_s + ping_timeout_s``. Connections, sessions,
  context length and frame size are capped; idle sessions expire.
- **Sessions are per server**, several per connection; closing a connection
  closes its sessions, and a connection cannot touch another's sessions.

``--device-map auto`` places the body layers across all visible GPUs with
accelerate (:func:`place_auto`); it is the path for bodies too large for one
GPU. It cannot be tested on a CPU-only machine; the code path is kept small.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import itertools
import logging
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

from splitinfer import batch_invariant as bi
from splitinfer.errors import ProtocolError, SplitInferError
from splitinfer.models import DTYPES, weights_sha256
from splitinfer.partition import CloudBody, SplitConfig
from splitinfer.protocol import decode_frame, error_frame
from splitinfer.session import BodyService, ServiceLimits

log = logging.getLogger(__name__)

FRAME_SLACK_BYTES = 2**20


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerConfig:
    """Network-facing settings of ``splitinfer serve`` (service limits live in ServiceLimits)."""

    host: str = "127.0.0.1"
    port: int = 5001
    token: str | None = None
    insecure: bool = False
    max_connections: int = 128
    hello_timeout_s: float = 10.0
    open_timeout_s: float = 10.0
    ping_interval_s: float = 20.0
    ping_timeout_s: float = 20.0
    close_timeout_s: float = 5.0
    workers: int = 4
    tls_cert: str | None = None
    tls_key: str | None = None

    def validate(self) -> None:
        if not 0 <= self.port < 65536:
            raise SplitInferError(f"bad --port {self.port}: must be in [0, 65535] (0 = pick a free port)")
        if not is_loopback(self.host) and not self.token and not self.insecure:
            raise SplitInferError(
                f"refusing to listen on non-loopback address {self.host!r} without a token: pass --token-file F "
                "(and --tls-cert/--tls-key or a TLS reverse proxy), or --insecure to accept anyone"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise SplitInferError("give both --tls-cert and --tls-key, or neither")
        for name in ("max_connections", "workers"):
            if getattr(self, name) < 1:
                raise SplitInferError(f"--{name.replace('_', '-')} must be >= 1")
        for name in ("hello_timeout_s", "open_timeout_s", "ping_interval_s", "ping_timeout_s", "close_timeout_s"):
            if not getattr(self, name) > 0:
                raise SplitInferError(f"--{name.replace('_', '-')} must be > 0")

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls_cert:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        except (OSError, ssl.SSLError) as e:
            raise SplitInferError(f"cannot load TLS certificate {self.tls_cert} / key {self.tls_key}: {e}") from None
        return ctx


# ---------------------------------------------------------------------- loading the body
def check_device(device: str) -> None:
    """Raise SplitInferError unless ``device`` exists here (clear message for a missing GPU)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise SplitInferError(f"unknown --device {device!r}; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SplitInferError(
                f"--device {device}: CUDA is not available here (torch.cuda.is_available() is False; "
                f"torch {torch.__version__} may be a CPU-only build); use --device cpu"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise SplitInferError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) visible")


def place_auto(body: CloudBody) -> CloudBody:
    """Spread the body's decoder layers over all visible GPUs (accelerate's big-model placement).

    Whole decoder layers stay on one device; accelerate's hooks move
    activations (and the mask and rotary tables) between devices, and each
    layer's KV cache lives on its layer's device. Untested without GPUs.
    """
    if not torch.cuda.is_available():
        raise SplitInferError("--device-map auto needs CUDA GPUs, and none is visible; use --device cpu")
    from accelerate import dispatch_model, infer_auto_device_map

    no_split = sorted({type(layer).__name__ for layer in body.layers})
    device_map = infer_auto_device_map(body, no_split_module_classes=no_split)
    if any(d in ("cpu", "disk") for d in device_map.values()):
        log.warning("the body does not fit on the GPUs; some layers are offloaded: %s", device_map)
    log.info("device map: %s", device_map)
    return dispatch_model(body, device_map=device_map)


class _NeedsPreparation(Exception):
    """The checkpoint must first be converted (GGUF) or written (tiny-random): done in a child process."""


def _weights_dir(spec: str, seed: int, prepare: bool = False) -> Path:
    """Directory of config.json + safetensors for ``spec``; with ``prepare=False`` never builds a full model."""
    from splitinfer import models

    if spec == "tiny-random":  # a test model built in code: save it once so the body can load from disk
        out = models.cache_dir() / "models" / f"tiny-random-seed{seed}"
        if not (out / "config.json").exists():
            if not prepare:
                raise _NeedsPreparation
            model, _ = models.tiny_random_model(seed=seed)
            model.save_pretrained(out)
        return out
    convert = models._convert_gguf
    if not prepare:  # converting a GGUF file loads the whole model: refuse here, do it in a child process

        def convert(*_args):
            raise _NeedsPreparation

    saved, models._convert_gguf = models._convert_gguf, convert
    try:
        weights = models.resolve_weights_dir(spec)
    finally:
        models._convert_gguf = saved
    if weights is not None:
        return weights
    if spec.count("/") != 1 or spec.startswith((".", "/", "~")):
        raise SplitInferError(f"unknown model spec {spec!r}: use default, gemma3-270m, tiny-random, a model "
                              "directory, a .gguf file or a Hugging Face id like 'org/name'")
    from huggingface_hub import snapshot_download

    try:  # config and safetensors only: the body reads its own layers' tensors from them
        patterns = ["config.json", "*.safetensors", "*.safetensors.index.json"]
        return Path(snapshot_download(spec, allow_patterns=patterns))
    except Exception as e:  # network, auth, missing repo
        raise SplitInferError(f"could not fetch {spec!r} from the Hugging Face hub: {e}".splitlines()[0]) from None


def weights_dir(spec: str, seed: int = 0) -> Path:
    """Resolve ``spec`` to a safetensors directory without ever loading the full model in this process.

    A GGUF spec (``default``, ``gemma3-270m``, ``*.gguf``) is converted once, and
    ``tiny-random`` written once, by a child process; later starts read the cache.
    """
    try:
        return _weights_dir(spec, seed)
    except _NeedsPreparation:
        pass
    log.warning("preparing %s once in a child process (this process loads only the body)", spec)
    code = "import sys; from splitinfer.server import _weights_dir; _weights_dir(sys.argv[1], int(sys.argv[2]), True)"
    r = subprocess.run([sys.executable, "-c", code, spec, str(seed)], capture_output=True, text=True)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise SplitInferError(f"preparing model {spec!r} failed: {tail}")
    return _weights_dir(spec, seed)


def load_body(spec: str, split: SplitConfig, dtype: str = "fp32", device: str = "cpu",
              device_map: str | None = None, seed: int = 0, batch_invariant: bool = False) -> tuple[CloudBody, dict]:
    """The body layers of ``spec`` (and nothing else) plus the info it announces at hello.

    ``batch_invariant``: run them with :mod:`splitinfer.batch_invariant`'s kernels.
    """
    if dtype not in DTYPES:
        raise SplitInferError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if device_map not in (None, "auto"):
        raise SplitInferError(f"unknown --device-map {device_map!r}; the only map is 'auto'")
    if device_map is None:
        check_device(device)
    weights = weights_dir(spec, seed)
    body = CloudBody.from_weights(weights, split, DTYPES[dtype], "cpu" if device_map else device)
    cfg = body.config
    info = {
        "model": spec,
        "body_sha256": weights_sha256(body),  # the same hash the client computes over its copy of these layers
        "hidden_size": cfg.hidden_size,
        "split": str(split),
        "num_layers": cfg.num_hidden_layers,
    }
    if device_map == "auto":
        body = place_auto(body)
    if batch_invariant:
        bi.enable(body)  # after placement: the padding is probed on the devices that will run it
    info["batch_invariant"] = bi.is_enabled(body)
    return body, info


def body_inventory(body: torch.nn.Module) -> dict:
    """What the process holds: module names, parameter count, whether any embedding / LM head is loaded."""
    names = sorted({name.split(".")[0] if not name.startswith("layers.") else ".".join(name.split(".")[:2])
                    for name, _ in body.named_modules() if name and name != "layers"})
    return {
        "loaded_modules": names,
        "param_count": sum(p.numel() for p in body.parameters()),
        "has_embedding": any(isinstance(m, torch.nn.Embedding) for m in body.modules()),
        "has_lm_head": any(n.split(".")[-1] in ("lm_head", "embed_tokens") for n, _ in body.named_modules()),
    }


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # not Linux
        return 0


# ---------------------------------------------------------------------- the server
class BodyServer:
    """Serves one :class:`BodyService` over WebSocket."""

    def __init__(self, service: BodyService, config: ServerConfig):
        config.validate()
        self.service, self.config = service, config
        self.connections = 0
        self._ids = itertools.count(1)
        self._pool = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="body")
        self._started = time.monotonic()
        self._inventory = body_inventory(service.body)
        self.url: str | None = None
        service.extra_stats = self._extra_stats

    def _extra_stats(self) -> dict:
        return {"connections": self.connections, "rss_bytes": _rss_bytes(),
                "uptime_s": round(time.monotonic() - self._started, 3), **self._inventory}

    async def serve(self, stop: asyncio.Event, on_ready: Callable[[str], None] | None = None) -> None:
        """Listen until ``stop`` is set, then close every connection and return."""
        cfg, limits = self.config, self.service.limits
        ctx = cfg.ssl_context()
        async with serve(
            self._handler, cfg.host, cfg.port, ssl=ctx, compression=None, server_header=None,
            max_size=limits.frame.max_frame_bytes + FRAME_SLACK_BYTES, max_queue=2,
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

    async def _reap(self) -> None:
        period = max(0.05, min(self.service.limits.idle_timeout_s / 4, 5.0))
        while True:
            await asyncio.sleep(period)
            self.service.expire_idle()

    async def _handler(self, ws) -> None:
        if self.connections >= self.config.max_connections:
            await self._refuse(ws, f"server is at its limit of {self.config.max_connections} connections; "
                                   "retry later", 1013)
            return
        conn = next(self._ids)
        self.connections += 1
        log.info("connection %d from %s", conn, ws.remote_address)
        try:
            if not await self._hello(ws, conn):
                return
            loop = asyncio.get_running_loop()
            async for message in ws:
                if isinstance(message, str):
                    reply = error_frame("got a text message; the protocol uses binary frames")
                else:
                    reply = await loop.run_in_executor(self._pool, self.service.handle, message, conn)
                await ws.send(reply)
        except ConnectionClosed:
            pass
        finally:
            self.connections -= 1
            dropped = self.service.close_owned(conn)
            log.info("connection %d closed (%s); dropped %d session(s)", conn, ws.close_code, dropped)

    async def _hello(self, ws, conn: int) -> bool:
        """Wait for the hello frame, check the token, answer it; False (connection closed) on failure."""
        try:
            first = await asyncio.wait_for(ws.recv(), self.config.hello_timeout_s)
        except TimeoutError:
            await self._refuse(ws, f"no hello frame within {self.config.hello_timeout_s:g} s of connecting", 1008)
            return False
        problem = self._check_hello(first)
        if problem:
            await self._refuse(ws, problem, 1008)
            return False
        loop = asyncio.get_running_loop()
        reply = await loop.run_in_executor(self._pool, self.service.handle, first, conn)
        await ws.send(reply)
        if decode_frame(reply).op != "welcome":  # the service refused it (version or body mismatch)
            await ws.close(1008, "hello refused")
            return False
        return True

    def _check_hello(self, data) -> str | None:
        if isinstance(data, str):
            return "the first message must be a binary hello frame, got a text message"
        try:
            frame = decode_frame(data, self.service.limits.frame)
        except ProtocolError as e:
            return f"bad hello frame: {e}"
        if frame.op != "hello":
            return f"the first frame must be 'hello', got {frame.op!r}"
        if self.config.token is not None:
            given = frame.fields.get("token")
            if not isinstance(given, str) or not hmac.compare_digest(given.encode(), self.config.token.encode()):
                log.warning("refused a hello with a missing or wrong token")
                return "hello refused: missing or wrong token (give the server's shared secret: --token-file)"
        return None

    @staticmethod
    async def _refuse(ws, message: str, code: int) -> None:
        try:
            await ws.send(error_frame(message))
            await ws.close(code, message[:120])
        except ConnectionClosed:
            pass


def run_server(service: BodyService, config: ServerConfig, on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until SIGINT or SIGTERM, then shut down cleanly."""
    import signal

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await BodyServer(service, config).serve(stop, on_ready)

    asyncio.run(main())


def make_service(body: CloudBody, info: dict, max_sessions: int = 64, max_context: int = 4096,
                 idle_timeout_s: float = 300.0, max_frame_bytes: int = 64 * 2**20) -> BodyService:
    """A BodyService with the CLI's limits (validated)."""
    from splitinfer.protocol import Limits

    if max_sessions < 1 or max_context < 1 or idle_timeout_s <= 0 or max_frame_bytes < 1024:
        raise SplitInferError("need --max-sessions >= 1, --max-context >= 1, --idle-timeout-s > 0, "
                              "--max-frame-mb >= 0.001")
    limits = ServiceLimits(max_sessions, max_context, idle_timeout_s, Limits(max_frame_bytes=max_frame_bytes))
    return BodyService(body, info, limits)
