"""``splitinfer serve`` and ``splitinfer chat``, and the ``--cloud`` flags of client commands.

``serve`` runs the cloud body as a WebSocket service (:mod:`splitinfer.server`);
``chat`` is an interactive multi-turn chat whose body runs in that service
(or in-process without ``--cloud``). :func:`register` mounts both on the
``splitinfer`` parser; :func:`add_cloud_args` and :class:`CloudFlags` give any
client command (``generate``) a ``--cloud ws://HOST:PORT`` option.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass

from splitinfer.cli_flags import LinkFlags, ModelFlags, add_link_args, add_model_args, finite_float, positive_int
from splitinfer.errors import SplitInferError

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- client side
def add_cloud_args(p: argparse.ArgumentParser) -> None:
    """``--cloud``, ``--token-file`` and ``--tls-ca`` for commands that talk to a body server."""
    p.add_argument("--cloud", default=None, metavar="URL",
                   help="ws://HOST:PORT or wss://HOST:PORT of `splitinfer serve` (default: body in-process)")
    p.add_argument("--token-file", default=None,
                   help="file holding the server's shared secret (else $SPLITINFER_TOKEN / $SPLITINFER_TOKEN_FILE)")
    p.add_argument("--tls-ca", default=None, metavar="PEM", help="trust this CA / self-signed certificate for wss://")


@dataclass(frozen=True)
class CloudFlags:
    """What ``--cloud --token-file --tls-ca`` chose: where the body runs."""

    cloud: str | None = None
    token_file: str | None = None
    tls_ca: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CloudFlags:
        return cls(cloud=args.cloud, token_file=args.token_file, tls_ca=args.tls_ca)

    def link(self, wan=None):
        """A WebSocketLink to ``cloud`` (None when the body should run in-process)."""
        if not self.cloud:
            if self.token_file or self.tls_ca:
                raise SplitInferError("--token-file and --tls-ca need --cloud ws://HOST:PORT")
            return None
        from splitinfer.ws_link import WebSocketLink, read_token_file

        token = read_token_file(self.token_file) if self.token_file else None
        return WebSocketLink(self.cloud, token=token, wan=wan, ca_file=self.tls_ca)


# ---------------------------------------------------------------------- serve
def cmd_serve(args) -> int:
    from splitinfer.batch_scheduler import BatchConfig
    from splitinfer.defenses.cli_args import DefenseFlags
    from splitinfer.partition import SplitConfig
    from splitinfer.server import ServerConfig, load_body, make_service, run_server
    from splitinfer.ws_link import read_token_file

    config = ServerConfig(
        host=args.host, port=args.port, token=read_token_file(args.token_file) if args.token_file else None,
        insecure=args.insecure, max_connections=args.max_connections, hello_timeout_s=args.hello_timeout_s,
        open_timeout_s=args.open_timeout_s, ping_interval_s=args.ping_interval_s, ping_timeout_s=args.ping_timeout_s,
        close_timeout_s=args.close_timeout_s, workers=args.workers, tls_cert=args.tls_cert, tls_key=args.tls_key,
        max_pending=args.max_pending, hello_max_bytes=int(args.hello_max_kb * 1024),
        connection_idle_s=args.connection_idle_s, message_timeout_s=args.message_timeout_s,
        max_inflight_bytes=None if args.max_inflight_mb is None else int(args.max_inflight_mb * 2**20),
    )
    config.validate()  # before loading anything: refuse a bad or unsafe setup at once
    BatchConfig(max_batch=args.max_batch, window_ms=args.batch_window_ms).validate()
    for warning in config.warnings():
        log.warning("%s", warning)
    defense = DefenseFlags.from_args(args).pipeline(fresh_secrets=True)
    defense.refuse_served_body("`splitinfer serve`")  # permute: transformed body weights are not shipped yet
    split = SplitConfig.parse(args.split)
    body, info = load_body(args.model, split, args.dtype, args.device, args.device_map, args.seed,
                           args.batch_invariant)
    service = make_service(body, info, args.max_sessions, args.max_context, args.idle_timeout_s,
                           int(args.max_frame_mb * 2**20), args.max_sessions_per_connection, args.stats_all,
                           BatchConfig(max_batch=args.max_batch, window_ms=args.batch_window_ms))
    service.set_defense(defense)  # the cloud's side: quantised frames, reply noise
    log.info("body of %s split %s: layers %d..%d, sha256 %s", args.model, split, body.first_layer,
             body.first_layer + len(body.layers) - 1, info.body_sha256[:16])

    def ready(url: str) -> None:
        print(f"listening on {url}", flush=True)

    run_server(service, config, ready)
    print("server stopped", file=sys.stderr, flush=True)
    return 0


# ---------------------------------------------------------------------- chat
def _chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    from splitinfer.tokens import encode_chat

    return encode_chat(tokenizer, messages).ids


def format_turn_stats(res) -> str:
    """One line for ``/stats``: the last turn's speed, steps and bytes."""
    if res is None:
        return "no turn yet"
    s = res.summary()
    parts = ", ".join(f"{k[:-3]} {v:.2f}" for k, v in s["breakdown_ms"].items())
    return (f"last turn: {s['new_tokens']} tokens in {s['steps']} steps ({s['tokens_per_step']:.2f} tok/step), "
            f"{s['tok_s']:.2f} tok/s, {s['wall_s']:.2f} s; prompt {s['prompt_tokens']} tokens; "
            f"sent {s['bytes_sent']} B, received {s['bytes_received']} B; per step ms: {parts}")


def cmd_chat(args) -> int:
    from splitinfer.client import SplitModel

    model, link, cloud = ModelFlags.from_args(args), LinkFlags.from_args(args), CloudFlags.from_args(args)
    loaded = model.load()
    tok = loaded.tokenizer
    if not loaded.has_chat_template:
        raise SplitInferError(f"model {model.model!r} has no chat template; use `splitinfer generate` instead")
    wan = link.wan(seed=model.seed)
    sm = SplitModel(loaded, args.split, cloud=cloud.link(wan), wan=wan, wire_dtype=link.wire_dtype)
    where = cloud.cloud or "in-process body"
    print(f"chat with {args.model} split {args.split} via {where}. /stats, /reset, /quit", file=sys.stderr)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages, last = list(system), None
    out = sys.stdout
    try:
        while True:
            try:
                line = input(">>> " if sys.stdin.isatty() else "")
            except EOFError:
                break
            line = line.strip()
            if not line:
                continue
            if line in ("/quit", "/exit"):
                break
            if line == "/stats":
                print(format_turn_stats(last), flush=True)
                continue
            if line == "/reset":
                messages = list(system)
                print("(conversation cleared)", flush=True)
                continue
            if line.startswith("/"):
                print(f"unknown command {line!r}; commands: /stats, /reset, /quit", flush=True)
                continue
            messages.append({"role": "user", "content": line})
            try:
                res = sm.generate(
                    _chat_ids(tok, messages), args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                    seed=model.seed, on_text=lambda t: (out.write(t), out.flush()),
                )
            except SplitInferError as e:  # keep the chat alive: report and drop the turn
                messages.pop()
                print(f"\nerror: {e}", file=sys.stderr, flush=True)
                continue
            out.write("\n")
            out.flush()
            messages.append({"role": "assistant", "content": res.text})
            last = res
    finally:
        sm.close()
    return 0


# ---------------------------------------------------------------------- registration
def register(sub) -> None:
    """Mount ``serve`` and ``chat`` on the ``splitinfer`` sub-command parser."""
    from splitinfer.defenses.cli_args import add_defense_args

    s = sub.add_parser("serve", help="run the cloud body as a WebSocket service")
    add_model_args(s)
    s.add_argument("--device-map", default=None, choices=["auto"],
                   help="auto: spread the body layers over all visible GPUs (accelerate)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback %(default)s)")
    s.add_argument("--port", type=int, default=5001, help="TCP port (0 = any free port; default %(default)s)")
    s.add_argument("--token-file", default=None, help="file holding the shared secret clients present at hello")
    s.add_argument("--insecure", action="store_true", help="allow a non-loopback --host without a token")
    s.add_argument("--tls-cert", default=None, help="PEM certificate chain: serve wss://")
    s.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    s.add_argument("--max-sessions", type=int, default=64)
    s.add_argument("--max-sessions-per-connection", type=int, default=8, help="session quota of one connection")
    s.add_argument("--max-connections", type=int, default=128, help="logged-in connections")
    s.add_argument("--max-pending", type=int, default=16,
                   help="connections not logged in yet (oldest dropped when full; default %(default)s)")
    s.add_argument("--hello-max-kb", type=finite_float, default=64.0, help="frame limit before the hello, in KiB")
    s.add_argument("--connection-idle-s", type=finite_float, default=300.0,
                   help="drop a logged-in connection without a forward for this long")
    s.add_argument("--message-timeout-s", type=finite_float, default=60.0,
                   help="drop a client whose message takes longer than this to arrive")
    s.add_argument("--stats-all", action="store_true",
                   help="operator mode: `stats` shows server-wide figures to every client (default: own sessions)")
    s.add_argument("--max-context", type=int, default=4096, help="tokens per session")
    s.add_argument("--idle-timeout-s", type=finite_float, default=300.0, help="drop sessions idle this long")
    s.add_argument("--max-frame-mb", type=finite_float, default=64.0, help="largest frame accepted, in MiB")
    s.add_argument("--max-inflight-mb", type=finite_float, default=None,
                   help="request bytes held at once over all connections, in MiB; beyond it the server stops "
                        "reading until replies go out (default: a sixteenth of physical memory)")
    s.add_argument("--hello-timeout-s", type=finite_float, default=5.0,
                   help="drop connections without a hello this long")
    s.add_argument("--open-timeout-s", type=finite_float, default=10.0, help="limit on the TLS + WebSocket handshake")
    s.add_argument("--ping-interval-s", type=finite_float, default=20.0, help="keepalive ping period")
    s.add_argument("--ping-timeout-s", type=finite_float, default=20.0,
                   help="drop a client that does not answer a ping")
    s.add_argument("--close-timeout-s", type=finite_float, default=5.0, help="wait this long for a peer's close reply")
    s.add_argument("--workers", type=int, default=4,
                   help="threads handling requests (at least --max-batch are started; default %(default)s)")
    s.add_argument("--max-batch", type=int, default=16,
                   help="sessions' body steps run as one packed forward (1 = no batching; default %(default)s)")
    s.add_argument("--batch-window-ms", type=finite_float, default=5.0,
                   help="how long the first ready step waits for other sessions' steps (default %(default)s)")
    add_defense_args(s)
    s.set_defaults(func=cmd_serve)

    c = sub.add_parser("chat", help="interactive multi-turn chat with the body in the cloud")
    add_model_args(c)
    add_link_args(c)
    add_cloud_args(c)
    c.add_argument("--max-new-tokens", type=positive_int, default=256, help="per reply")
    c.add_argument("--system", default=None, help="optional system prompt")
    c.add_argument("--temperature", type=finite_float, default=0.0, help="0 = greedy (default)")
    c.add_argument("--top-p", type=finite_float, default=1.0)
    c.set_defaults(func=cmd_chat)
