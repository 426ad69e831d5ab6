"""Settings of ``splitinfer serve`` that face the network, and the checks run before anything loads.

:class:`ServerConfig` holds the listening address, authentication, TLS and the
connection-level limits (the per-session limits are
:class:`splitinfer.session.ServiceLimits`). :meth:`ServerConfig.validate`
refuses unsafe or impossible setups; :meth:`ServerConfig.warnings` names risky
but allowed ones (a token sent in clear text over a non-loopback ``ws://``).
:func:`check_device` names a missing GPU in one line.
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass

import torch

from splitinfer.errors import SplitInferError


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
    max_connections: int = 128  # logged-in connections
    max_pending: int = 16  # connections that have not sent a valid hello yet (a separate, smaller pool)
    hello_timeout_s: float = 5.0  # a pending connection must say hello within this
    hello_max_bytes: int = 64 * 2**10  # frame limit before the hello (a hello is a few hundred bytes)
    connection_idle_s: float = 300.0  # drop a logged-in connection that does no real work for this long
    message_timeout_s: float = 60.0  # a message, once its first byte arrived, must be complete within this
    open_timeout_s: float = 10.0
    ping_interval_s: float = 20.0
    ping_timeout_s: float = 20.0
    close_timeout_s: float = 5.0
    workers: int = 4
    max_inflight_bytes: int | None = None  # request bytes held at once, all connections (None: RAM / 16)
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
        for name in ("max_connections", "max_pending", "workers"):
            if getattr(self, name) < 1:
                raise SplitInferError(f"--{name.replace('_', '-')} must be >= 1")
        if self.max_inflight_bytes is not None and self.max_inflight_bytes < 2**20:
            raise SplitInferError("--max-inflight-mb must be >= 1")
        if self.hello_max_bytes < 1024:
            raise SplitInferError("--hello-max-kb must be >= 1")
        for name in ("hello_timeout_s", "open_timeout_s", "ping_interval_s", "ping_timeout_s", "close_timeout_s",
                     "connection_idle_s", "message_timeout_s"):
            if not getattr(self, name) > 0:
                raise SplitInferError(f"--{name.replace('_', '-')} must be > 0")

    def warnings(self) -> list[str]:
        """Risky but allowed setups, one line each (``serve`` logs them at start)."""
        out = []
        if not is_loopback(self.host) and self.token and not self.tls_cert:
            out.append(f"listening on {self.host} over plain ws:// with a token: the token and every hidden state "
                       "cross the network in clear text; add --tls-cert/--tls-key or put a TLS proxy in front")
        if self.token and len(self.token) < 16:
            out.append(f"the token is short ({len(self.token)} characters); use at least 16 random characters")
        if self.insecure and not self.token:
            out.append(f"--insecure: anyone who can reach {self.host} may use this server")
        return out

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls_cert:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        except (OSError, ssl.SSLError) as e:
            raise SplitInferError(f"cannot load TLS certificate {self.tls_cert} / key {self.tls_key}: {e}") from None
        return ctx


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
