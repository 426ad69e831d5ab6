"""What a session costs the server, and what a full pending pool costs a logged-in client.

Developer note: issue 16.

Run: ``python -m benchmarks.server_limits --model tiny-random`` (prints figures; no results file).

1. **Memory per session.** Starts ``splitinfer serve`` with ``--max-context C``,
   opens N sessions and fills each to C positions; compares the server's RSS
   growth per session with the formula

       KV bytes per session = 2 (K and V) x body layers x KV heads x head dim x dtype bytes x C

   plus a fixed overhead per session (measured: RSS growth per empty session).
2. **Round trip under a full pending pool.** The median time of a one-token
   forward of an authenticated client, unloaded and while other threads keep
   the pending pool full of silent connections and connections sending frames
   over the pre-login limit (reconnecting as the server drops them). Target:
   loaded median within 2x the unloaded one.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import torch

from splitinfer.cli_flags import finite_float
from splitinfer.protocol import PROTOCOL_VERSION, decode_frame, encode_frame

TOKEN = "benchmark-token-0123456789"


def _start(model: str, split: str, max_context: int, token_file: Path,
           extra: list[str]) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "splitinfer.cli", "serve", "--model", model, "--split", split, "--port", "0",
           "--max-context", str(max_context), "--max-sessions", "64", "--max-sessions-per-connection", "64",
           "--stats-all", "--token-file", str(token_file), "--max-pending", "16", "--hello-timeout-s", "2", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    for line in proc.stdout:
        if line.startswith("listening on "):
            return proc, line.split()[-1]
    raise SystemExit(f"server did not start: exit {proc.wait()}")


class Client:
    def __init__(self, url: str):
        from websockets.sync.client import connect

        self.ws = connect(url, compression=None, max_size=None)  # (a deprecation warning on websockets >= 16)
        reply = self.request(encode_frame("hello", {"protocol": PROTOCOL_VERSION, "token": TOKEN}))
        assert reply.op == "welcome", reply.fields
        self.d = reply.fields["hidden_size"]

    def request(self, data: bytes):
        self.ws.send(data)
        return decode_frame(self.ws.recv(timeout=600))

    def open(self) -> str:
        return self.request(encode_frame("open")).fields["session"]

    def forward(self, sid: str, start: int, n: int):
        hidden = torch.randn(1, n, self.d).half()  # (1, n, d)
        reply = self.request(encode_frame("forward", {"session": sid, "positions": list(range(start, start + n))},
                                          {"hidden": hidden}))
        assert reply.op == "result", reply.fields
        return reply

    def stats(self) -> dict:
        return self.request(encode_frame("stats")).fields


def kv_bytes_per_position(model: str, split: str) -> tuple[int, dict]:
    from transformers import AutoConfig

    from splitinfer.body_weights import weights_dir
    from splitinfer.partition import SplitConfig

    cfg = AutoConfig.from_pretrained(weights_dir(model))
    s = SplitConfig.parse(split)
    layers = cfg.num_hidden_layers - s.head_layers - s.tail_layers
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per = 2 * layers * kv_heads * head_dim * 4  # fp32 body
    return per, {"body_layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "dtype_bytes": 4}


def memory_per_session(url: str, sessions: int, max_context: int, chunk: int) -> dict:
    c = Client(url)

    def fill(sid: str) -> None:
        for start in range(0, max_context, chunk):
            c.forward(sid, start, min(chunk, max_context - start))

    warm = c.open()
    fill(warm)  # the first forwards allocate once-only buffers: not a per-session cost
    c.request(encode_frame("close", {"session": warm}))
    base = c.stats()["rss_bytes"]
    empty = [c.open() for _ in range(sessions)]
    after_open = c.stats()["rss_bytes"]
    for sid in empty:
        fill(sid)
    full = c.stats()
    c.ws.close()
    return {"rss_base": base, "overhead_per_session": (after_open - base) / sessions,
            "rss_growth_per_session": (full["rss_bytes"] - base) / sessions, "kv_bytes_per_session":
            full["kv_bytes"] / sessions}


def _flood(host: str, port: int, stop: threading.Event, big: bool, pause_s: float) -> None:
    """Keep connecting without a hello (or with an oversized first frame); reconnect ``pause_s`` after a drop."""
    handshake = (b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    frame = bytes([0x82, 0xFF]) + (8 * 2**20).to_bytes(8, "big") + b"\0\0\0\0" + b"\0" * 65536
    while not stop.is_set():
        try:
            with socket.create_connection((host, port), timeout=5) as s:
                s.sendall(handshake)
                s.recv(4096)
                if big:
                    s.sendall(frame)
                s.settimeout(0.5)
                while not stop.is_set():
                    try:
                        if s.recv(65536) == b"":
                            break
                    except TimeoutError:
                        continue
        except OSError:
            time.sleep(0.05)
        time.sleep(pause_s)


def _flood_process(host: str, port: int, flood: int, stop, pause_s: float) -> None:
    """The hostile connections, in their own process (so they do not take the measuring client's GIL)."""
    done = threading.Event()
    threads = [threading.Thread(target=_flood, args=(host, port, done, i % 4 == 0, pause_s), daemon=True)
               for i in range(flood)]
    for t in threads:
        t.start()
    stop.wait()
    done.set()


def round_trips(url: str, n: int, flood: int, pause_s: float = 0.0) -> list[float]:
    import multiprocessing as mp

    host, port = url.split("//")[1].rsplit(":", 1)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    flooder = ctx.Process(target=_flood_process, args=(host, int(port), flood, stop, pause_s),
                          daemon=True) if flood else None
    if flooder:
        flooder.start()
        time.sleep(3.0)  # the pool is full and churning
    c = Client(url)
    sid = c.open()
    c.forward(sid, 0, 1)  # warm-up, not timed
    times = []
    for i in range(n):
        if i % 32 == 0:  # keep the context short (not timed)
            c.request(encode_frame("commit", {"session": sid, "crop": 0}))
        t0 = time.perf_counter()
        c.forward(sid, i % 32, 1)
        times.append(time.perf_counter() - t0)
    c.ws.close()
    if flooder:
        stop.set()
        flooder.join(10)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--split", default="2,2")
    p.add_argument("--max-context", type=int, default=1024)
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--chunk", type=int, default=256, help="positions per prefill forward")
    p.add_argument("--round-trips", type=int, default=300)
    p.add_argument("--flood", default="16,32", help="hostile connection threads, comma-separated runs "
                   "(the pending pool holds 16; a quarter of them send an oversized first frame)")
    p.add_argument("--pause-ms", type=finite_float, default=20.0,
                   help="second run per flood size: hostile clients wait this long before reconnecting")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="websockets")
    with tempfile.TemporaryDirectory() as tmp:
        token_file = Path(tmp) / "token"
        token_file.write_text(TOKEN)
        proc, url = _start(args.model, args.split, args.max_context, token_file, [])
        try:
            per_pos, shape = kv_bytes_per_position(args.model, args.split)
            mem = memory_per_session(url, args.sessions, args.max_context, args.chunk)
            formula = per_pos * args.max_context + mem["overhead_per_session"]
            print(f"model {args.model} split {args.split}: KV bytes per position {per_pos} "
                  f"(2 x {shape['body_layers']} layers x {shape['kv_heads']} KV heads x {shape['head_dim']} x "
                  f"{shape['dtype_bytes']} B)")
            print(f"  {args.sessions} sessions filled to --max-context {args.max_context}: kv_bytes per session "
                  f"{mem['kv_bytes_per_session'] / 2**20:.2f} MiB (formula {per_pos * args.max_context / 2**20:.2f} "
                  f"MiB); RSS growth per session {mem['rss_growth_per_session'] / 2**20:.2f} MiB; formula incl. "
                  f"fixed overhead {mem['overhead_per_session'] / 2**10:.1f} KiB: {formula / 2**20:.2f} MiB; "
                  f"ratio measured/formula {mem['rss_growth_per_session'] / formula:.2f}")
            mq = statistics.median(round_trips(url, args.round_trips, 0))
            print(f"  round trip (1-token forward), median of {args.round_trips}: unloaded {1e3 * mq:.2f} ms")
            for flood, pause in [(int(x), p) for x in args.flood.split(",") for p in (0.0, args.pause_ms / 1e3)]:
                loaded = round_trips(url, args.round_trips, flood, pause)
                ml = statistics.median(loaded)
                print(f"  with {flood} hostile connections reconnecting {1e3 * pause:g} ms after each drop: median "
                      f"{1e3 * ml:.2f} ms (ratio {ml / mq:.2f}; target <= 2), p90 "
                      f"{1e3 * sorted(loaded)[int(0.9 * len(loaded))]:.2f} ms")
        finally:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
