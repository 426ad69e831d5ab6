"""Peak memory of the cloud side, measured on a real ``splitinfer serve`` process.

The speed benchmark runs the body in-process, so its process RSS mixes both
sides. This module starts the body server as its own process (it loads only
the body layers' weights, :meth:`CloudBody.from_weights`), drives a
generation through it over a real WebSocket, and reads the server's
resident memory from ``/proc/PID/status``: ``VmRSS`` once loaded and idle,
``VmHWM`` (the kernel's high-water mark) after the generation. Linux only;
elsewhere it reports nothing rather than guessing.
"""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from splitinfer.errors import SplitInferError


def proc_memory(pid: int) -> dict[str, int]:
    """{"rss_bytes", "peak_rss_bytes"} of a live process from /proc (empty when unavailable)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024  # kB
    if len(fields) != 2:
        return {}
    return {"rss_bytes": fields["VmRSS"], "peak_rss_bytes": fields["VmHWM"]}


def _read_url(proc: subprocess.Popen, timeout_s: float) -> str:
    """The ws:// URL from the server's "listening on URL" line (the server prints it once ready)."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        if line.startswith("listening on "):
            return line.split()[-1]
    if proc.poll() is None:
        raise SplitInferError(f"the body server did not print its URL within {timeout_s:.0f} s")
    last = (proc.stderr.read().strip().splitlines() or ["no output"])[-1] if proc.stderr else "no output"
    raise SplitInferError(f"the body server exited with code {proc.returncode}: {last}")


def server_memory(spec: str, split: str, drive, timeout_s: float = 600.0, batch_invariant: bool = False) -> dict[str, int]:
    """Start ``splitinfer serve --model spec --split split`` on a free port, call ``drive(url)``, measure.

    ``drive`` runs the client side (e.g. a generation through ``SplitModel(..., cloud=url)``).
    Returns ``{"loaded_rss_bytes", "peak_rss_bytes"}`` of the server process ({} off Linux).
    """
    cmd = [sys.executable, "-m", "splitinfer.cli", "serve", "--model", spec, "--split", split, "--port", "0",
           "--workers", "1", *(["--batch-invariant"] if batch_invariant else [])]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = _read_url(proc, timeout_s)
        loaded = proc_memory(proc.pid)
        drive(url)
        after = proc_memory(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    if not loaded or not after:
        return {}
    return {"loaded_rss_bytes": loaded["rss_bytes"], "peak_rss_bytes": after["peak_rss_bytes"]}
