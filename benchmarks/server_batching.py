"""``splitinfer bench batching``: the body server's tokens/s against concurrent sessions, batched vs unbatched.

1. **Record** the request frames of real split generations once: greedy
   sequential decoding of a few prompts of different lengths with the body
   in-process (:class:`RecordingLink`); the frames are exactly what
   ``generate --cloud`` sends (fp16 hidden states, one prefill then one
   forward per token).
2. **Replay** them against a real ``splitinfer serve`` process: each session
   is a thread of this process on its own connection that sends the recorded
   frames (its session id put in), waits for each reply and then sleeps the
   emulated round trip. Client-side compute (head, tail, sampling) is not
   run, so the clients hardly use the cores the server computes on.
3. **Measure server-side**: the server's own count of body tokens (``stats``
   ``tokens`` with ``--stats-all``: positions run through the body) over the
   wall time from the start to the end of the decode phase; every session
   has sent its prefill before the clock starts. Memory per session: the
   server's KV bytes and its RSS growth with all sessions open, per session.
4. **Step latency**: each decode ``forward``'s time from send to reply at the
   client (the emulated round trip excluded), pooled over the cell's sessions:
   p50 and p90. A batched server buys throughput with waiting (the window, the
   larger packed forward), so its p50 is set beside the unbatched server's at
   the same concurrency and at its best one (``p50_vs_unbatched``,
   ``p50_vs_best_unbatched``).

Beside it, :func:`compute_probe` times the body in-process: k single-token
steps as one packed forward against k forwards, which separates the
forward's own cost from the server's overhead.

The same frames go to an unbatched server (``--max-batch 1``) and a batched
one; their replies are compared (``max_abs_diff``; 0 means bit-identical).
Each row's throughput is set against the unbatched server at the same number
of sessions (``speedup``) and at its best concurrency for that RTT
(``speedup_vs_best_unbatched``: the unbatched server slows down past a few
concurrent sessions, so the first ratio flatters batching).

5. **Repeats**: both servers are up at once and every cell is measured
   ``repeats`` times (default 3), the two modes back to back in alternating
   order; the rows are medians, and the ratio to the unbatched best is also
   given per repeat (lowest and highest), since one short run moves it by
   tenths (an earlier single run gave 2.02x at 8 sessions and RTT 80 ms, the
   same code an hour before 1.70x, the unbatched best differing). Memory
   figures come from the first repeat.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import threading
import time

import torch

from benchmarks.schema import add_metric, metric
from benchmarks.transport import ServerProcess
from splitinfer.batch_scheduler import BatchConfig
from splitinfer.client import SplitModel, body_info
from splitinfer.errors import SplitInferError
from splitinfer.kv_cache import PartKVCache
from splitinfer.link import InProcessLink
from splitinfer.models import LoadedModel, load_model
from splitinfer.packed_body import BodyStep, run_packed
from splitinfer.partition import CloudBody, SplitConfig
from splitinfer.protocol import decode_frame, encode_frame
from splitinfer.remote import RemoteBody
from splitinfer.session import BodyService
from splitinfer.ws_link import WebSocketLink

log = logging.getLogger(__name__)

PROMPTS = [  # different lengths: the sessions' caches are ragged
    "Hi.",
    "Explain in a few sentences why the sky is blue.",
    "Write a Python function to implement binary search on a sorted array. Include docstring and type hints.",
    "I have trouble sleeping at night. What are some practical tips that could help? I already avoid coffee "
    "after noon and I go to bed at the same time every day, but I still wake up around three in the morning.",
]
MODES = {"unbatched": ("--max-batch", "1"), "batched": ()}


class RecordingLink(InProcessLink):
    """An in-process link that keeps every request frame it carries."""

    def __init__(self, service: BodyService):
        super().__init__(service)
        self.frames: list[bytes] = []

    def _exchange(self, frame: bytes) -> bytes:
        self.frames.append(frame)
        return super()._exchange(frame)


def record(loaded: LoadedModel, split: SplitConfig, n_tokens: int, wire: str) -> list[list]:
    """Per prompt: the (op, fields without session, tensors) of its session's forward and commit requests."""
    body = CloudBody.from_model(loaded.model, split)
    link = RecordingLink(BodyService(body, body_info(loaded.spec, split, body, loaded.hidden_size,
                                                     loaded.num_layers)))
    sm = SplitModel(loaded, split, cloud=link, wire_dtype=wire)
    chat = loaded.has_chat_template
    recordings = []
    for prompt in PROMPTS:
        link.frames.clear()
        sm.generate(sm.encode_prompt(prompt, chat=chat), n_tokens, stop_on_eos=False)
        frames = [decode_frame(f) for f in link.frames]
        recordings.append([(f.op, {k: v for k, v in f.fields.items() if k != "session"}, dict(f.tensors))
                           for f in frames if f.op in ("forward", "commit")])
    sm.close()
    return recordings


class ReplayClient:
    """One session on its own connection, replaying recorded requests."""

    def __init__(self, url: str, requests: list):
        self.link = WebSocketLink(url)
        remote = RemoteBody(self.link, replay=False)
        remote.hello()
        sid = remote.open()
        self.frames = [encode_frame(op, {"session": sid, **fields}, tensors) for op, fields, tensors in requests]
        self.ops = [op for op, _, _ in requests]
        self.replies: list[torch.Tensor] = []
        self.step_ms: list[float] = []  # per decode forward: send -> reply at the client

    def send(self, frame: bytes, keep: bool) -> float:
        t0 = time.perf_counter()
        reply = decode_frame(self.link.request(frame))
        ms = 1e3 * (time.perf_counter() - t0)
        if reply.op == "error":
            raise SplitInferError(f"the server refused a replayed frame: {reply.fields.get('message')}")
        if keep and "hidden" in reply.tensors:
            self.replies.append(reply.tensors["hidden"].clone())
        return ms

    def prefill(self) -> None:
        self.send(self.frames[0], keep=True)

    def decode(self, rtt_s: float) -> None:
        for op, frame in zip(self.ops[1:], self.frames[1:]):
            ms = self.send(frame, keep=True)
            if op == "forward":
                self.step_ms.append(ms)
            if rtt_s:
                time.sleep(rtt_s)

    def close(self) -> None:
        self.link.close()


def _stats(url: str) -> dict:
    link = WebSocketLink(url)
    try:
        RemoteBody(link, replay=False).hello()
        return decode_frame(link.request(encode_frame("stats"))).fields
    finally:
        link.close()


def measure(url: str, recordings: list, sessions: int, rtt_ms: float) -> tuple[dict, list]:
    """One cell: ``sessions`` clients replaying at once; the row and each client's replies."""
    base = _stats(url)
    clients = [ReplayClient(url, recordings[i % len(recordings)]) for i in range(sessions)]
    for c in clients:
        c.prefill()
    before = _stats(url)
    errors: list[BaseException] = []

    def run(c):
        try:
            c.decode(rtt_ms / 1e3)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(c,)) for c in clients]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    after = _stats(url)  # every session still open: its cache at full length
    for c in clients:
        c.close()
    if errors:
        raise SplitInferError(f"a replay client failed: {errors[0]}")
    tokens = after["tokens"] - before["tokens"]
    step_ms = [ms for c in clients for ms in c.step_ms]
    p50, p90 = _percentile(step_ms, 50), _percentile(step_ms, 90)
    row = {"sessions": sessions, "rtt_ms": rtt_ms, "body_tokens": tokens, "wall_s": round(wall, 4),
           "body_tok_s": tokens / wall, "steps": after["forwards"] - before["forwards"],
           "forwards": after.get("batch_forwards", 0) - before.get("batch_forwards", 0),
           "kv_bytes_per_session": after["kv_bytes"] / sessions,
           "rss_bytes_per_session": (after["rss_bytes"] - base["rss_bytes"]) / sessions,
           "rss_bytes": after["rss_bytes"], "steps_timed": len(step_ms), "step_ms_p50": p50, "step_ms_p90": p90}
    return row, [c.replies for c in clients]


@torch.no_grad()
def compute_probe(loaded: LoadedModel, split: SplitConfig, sessions: tuple[int, ...], context: int = 64,
                  repeats: int = 5) -> list[dict]:
    """In-process body compute of k single-token steps: one packed forward vs k forwards (median ms).

    Separates the forward's own cost from the server's overhead (transport, scheduling) in the replay figures.
    """
    body = CloudBody.from_model(loaded.model, split)
    gen = torch.Generator().manual_seed(0)
    d = loaded.hidden_size
    caches = []
    for _ in range(max(sessions)):
        cache = PartKVCache()
        body(torch.randn(1, context, d, generator=gen), torch.arange(context), cache)
        caches.append(cache)
    rows = []
    for k in sessions:
        steps = [BodyStep(torch.randn(1, 1, d, generator=gen), torch.tensor([context]), c) for c in caches[:k]]

        def timed(fn) -> float:
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - t0))
                for c in caches[:k]:
                    c.crop(context)
            return statistics.median(times)

        alone = timed(lambda: [body(s.hidden, s.positions, s.cache) for s in steps])
        packed = timed(lambda: run_packed(body, steps)) if k > 1 else alone
        rows.append({"sessions": k, "context": context, "one_by_one_ms": alone, "packed_ms": packed,
                     "compute_speedup": alone / packed})
    return rows


def _percentile(xs: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of a non-empty list."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def _max_diff(a: list, b: list) -> float:
    return max(float((x.float() - y.float()).abs().max()) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def run_batching(model: str = "default", split: str = "2,2", sessions: tuple[int, ...] = (1, 2, 4, 8, 16),
                 rtts: tuple[float, ...] = (0.0, 80.0), n_tokens: int = 32, wire: str = "fp16",
                 server_threads: int = 2, batch: BatchConfig = BatchConfig(), batch_invariant: bool = False,
                 repeats: int = 3) -> dict:
    """The whole benchmark; a JSON-able dict (see the module docstring).

    Both servers run side by side (the idle one waits on its socket) and every cell is measured ``repeats``
    times, the two modes back to back within a repeat and in alternating order, so a drift of the machine's
    speed over the run falls on both modes alike. ``runs`` keeps every measurement; ``rows`` has one row per
    (mode, RTT, sessions) with medians over the repeats (:func:`summarise`).
    """
    batch.validate()
    if repeats < 1:
        raise SplitInferError(f"--repeats {repeats}: give an integer >= 1 (each cell is measured that many times)")
    sp = SplitConfig.parse(split)
    loaded = load_model(model)
    t0 = time.perf_counter()
    recordings = record(loaded, sp, n_tokens, wire)
    record_s = time.perf_counter() - t0
    compute = compute_probe(loaded, sp, sessions)
    del loaded
    extra = ("--stats-all", "--batch-window-ms", f"{batch.window_ms:g}",
             *(("--batch-invariant",) if batch_invariant else ()))
    servers: dict[str, ServerProcess] = {}
    runs, diffs, first = [], {}, {}
    try:
        for mode, flags in MODES.items():
            servers[mode] = ServerProcess(model, split, server_threads,
                                          (*extra, *(flags or ("--max-batch", str(batch.max_batch)))))
            measure(servers[mode].url, recordings, 1, 0.0)  # warm-up
        for rep in range(repeats):
            for rtt in rtts:
                for k in sessions:
                    for mode in (list(MODES) if rep % 2 == 0 else list(MODES)[::-1]):
                        row, got = measure(servers[mode].url, recordings, k, rtt)
                        runs.append({"mode": mode, "repeat": rep, **row})
                        first.setdefault((mode, rtt, k), got)
                        ref = first.get(("unbatched", rtt, k))
                        if ref is not None:  # every reply against the unbatched server's first replies
                            key = (mode, rtt, k)
                            diffs[key] = max(diffs.get(key, 0.0), _max_diff(got, ref))
                        log.info("repeat %d %s rtt %g sessions %d: %.1f body tok/s", rep, mode, rtt, k,
                                 row["body_tok_s"])
    finally:
        for server in servers.values():
            server.stop()
    return {"model": model, "split": split, "wire_dtype": wire, "n_tokens": n_tokens, "prompts": len(PROMPTS),
            "prompt_lengths": [len(r[0][2]["hidden"][0]) for r in recordings], "server_threads": server_threads,
            "max_batch": batch.max_batch, "batch_window_ms": batch.window_ms, "batch_invariant": batch_invariant,
            "repeats": repeats, "cpus": os.cpu_count(), "record_s": round(record_s, 2),
            "rows": summarise(runs, diffs), "runs": runs, "compute": compute}


def summarise(runs: list[dict], diffs: dict | None = None) -> list[dict]:
    """One row per (mode, RTT, sessions) from the repeated measurements ``runs``.

    ``body_tok_s``, ``step_ms_p50`` and ``step_ms_p90`` are medians over the repeats (``*_min`` / ``*_max``
    beside the throughput). Ratios: ``speedup`` against the unbatched server at the same concurrency and
    ``speedup_vs_best_unbatched`` against its best concurrency for that RTT, both on the medians; and, paired
    by repeat (each repeat's batched figure over the same repeat's unbatched best),
    ``speedup_vs_best_unbatched_min`` / ``_max``: the spread a single run would show.
    """
    cells: dict[tuple, list[dict]] = {}
    for r in runs:
        cells.setdefault((r["mode"], r["rtt_ms"], r["sessions"]), []).append(r)
    rows = []
    for (mode, rtt, k), group in cells.items():
        tok = [r["body_tok_s"] for r in group]
        row = {key: v for key, v in group[0].items() if key not in ("repeat", "wall_s", "rss_bytes")}
        row.update({"repeats": len(group), "body_tok_s": statistics.median(tok), "body_tok_s_min": min(tok),
                    "body_tok_s_max": max(tok),
                    "step_ms_p50": statistics.median(r["step_ms_p50"] for r in group),
                    "step_ms_p90": statistics.median(r["step_ms_p90"] for r in group),
                    "steps": sum(r["steps"] for r in group), "forwards": sum(r["forwards"] for r in group),
                    "max_abs_diff": (diffs or {}).get((mode, rtt, k), 0.0)})
        rows.append(row)
    best = {}  # rtt -> the unbatched server's median row at its best concurrency (not its contended one)
    for r in rows:
        if r["mode"] == "unbatched" and r["body_tok_s"] > best.get(r["rtt_ms"], {}).get("body_tok_s", -1.0):
            best[r["rtt_ms"]] = r
    best_by_repeat = {}  # (rtt, repeat) -> the unbatched best of that repeat
    for r in runs:
        key = (r["rtt_ms"], r["repeat"])
        if r["mode"] == "unbatched":
            best_by_repeat[key] = max(best_by_repeat.get(key, 0.0), r["body_tok_s"])
    for row in rows:
        rtt, k = row["rtt_ms"], row["sessions"]
        unb = next(r for r in rows if r["mode"] == "unbatched" and (r["rtt_ms"], r["sessions"]) == (rtt, k))
        row["speedup"] = row["body_tok_s"] / unb["body_tok_s"]
        row["speedup_vs_best_unbatched"] = row["body_tok_s"] / best[rtt]["body_tok_s"]
        paired = [r["body_tok_s"] / best_by_repeat[rtt, r["repeat"]] for r in runs
                  if (r["mode"], r["rtt_ms"], r["sessions"]) == (row["mode"], rtt, k)]
        row["speedup_vs_best_unbatched_min"], row["speedup_vs_best_unbatched_max"] = min(paired), max(paired)
        row["best_unbatched_sessions"] = best[rtt]["sessions"]
        row["p50_vs_unbatched"] = row["step_ms_p50"] / unb["step_ms_p50"]
        row["p50_vs_best_unbatched"] = row["step_ms_p50"] / best[rtt]["step_ms_p50"]
    return rows


def format_batching(r: dict) -> str:
    lines = [f"server batching: model {r['model']} split {r['split']}, wire {r['wire_dtype']}, {r['n_tokens']} "
             f"decode steps per session, prompts of {r['prompt_lengths']} tokens, server threads "
             f"{r['server_threads']}, --max-batch {r['max_batch']} --batch-window-ms {r['batch_window_ms']:g}"
             f"{' --batch-invariant' if r['batch_invariant'] else ''}, {r['cpus']} CPUs; medians over "
             f"{r.get('repeats', 1)} repeat(s) of every cell, the modes interleaved; 'range' is the lowest and "
             "highest ratio one repeat alone gave (its batched figure over its own unbatched best)", "",
             f"{'mode':>9} {'rtt ms':>6} {'sessions':>8} {'body tok/s':>10} {'x unbatched':>11} {'x best unb.':>11} "
             f"{'range':>11} "
             f"{'steps/forward':>13} {'p50 ms':>7} {'p90 ms':>7} {'p50 x unb.':>10} {'p50 x best':>10} "
             f"{'KV MiB/session':>14} {'RSS MiB/session':>15} {'max |diff|':>10}"]
    for row in r["rows"]:
        per_forward = row["steps"] / row["forwards"] if row["forwards"] else 1.0
        lines.append(f"{row['mode']:>9} {row['rtt_ms']:>6g} {row['sessions']:>8} {row['body_tok_s']:>10.1f} "
                     f"{row['speedup']:>11.2f} {row.get('speedup_vs_best_unbatched', float('nan')):>11.2f} "
                     f"{_range(row):>11} "
                     f"{per_forward:>13.2f} {row['step_ms_p50']:>7.1f} {row['step_ms_p90']:>7.1f} "
                     f"{row['p50_vs_unbatched']:>10.2f} {row['p50_vs_best_unbatched']:>10.2f} "
                     f"{row['kv_bytes_per_session'] / 2**20:>14.2f} "
                     f"{row['rss_bytes_per_session'] / 2**20:>15.2f} {row['max_abs_diff']:>10.3g}")
    lines += ["", "in-process body compute of k single-token steps (no server; median ms):",
              f"{'sessions':>8} {'one by one':>10} {'packed':>8} {'x':>6}"]
    for row in r.get("compute", []):
        lines.append(f"{row['sessions']:>8} {row['one_by_one_ms']:>10.1f} {row['packed_ms']:>8.1f} "
                     f"{row['compute_speedup']:>6.2f}")
    return "\n".join(lines)


def _range(row: dict) -> str:
    lo, hi = row.get("speedup_vs_best_unbatched_min"), row.get("speedup_vs_best_unbatched_max")
    return "-" if lo is None else f"{lo:.2f}-{hi:.2f}"


def batching_document(raw: dict) -> dict:
    from benchmarks.bench_output import document

    config = {k: v for k, v in raw.items() if v is None or isinstance(v, (str, int, float, bool))}
    doc = document("batching", config, raw)
    for row in raw["rows"]:
        run = f"batching/mode={row['mode']}/rtt={row['rtt_ms']:g}/sessions={row['sessions']}"
        add_metric(doc, run, "body_tok_s", metric(row["body_tok_s"], kind="info", unit="tok/s"))
        add_metric(doc, run, "speedup", metric(row["speedup"], kind="info"))
        if "speedup_vs_best_unbatched" in row:
            add_metric(doc, run, "speedup_vs_best_unbatched", metric(row["speedup_vs_best_unbatched"], kind="info"))
        for name in ("speedup_vs_best_unbatched_min", "speedup_vs_best_unbatched_max"):
            if name in row:
                add_metric(doc, run, name, metric(row[name], kind="info", n=row["repeats"]))
        for name in ("step_ms_p50", "step_ms_p90"):
            add_metric(doc, run, name, metric(row[name], higher_is_better=False, kind="info", unit="ms",
                                              n=row["steps_timed"]))
        add_metric(doc, run, "p50_vs_best_unbatched", metric(row["p50_vs_best_unbatched"], higher_is_better=False,
                                                             kind="info"))
        add_metric(doc, run, "kv_bytes_per_session", metric(row["kv_bytes_per_session"], higher_is_better=False,
                                                            kind="info", unit="B"))
        add_metric(doc, run, "max_abs_diff", metric(row["max_abs_diff"], higher_is_better=False, kind="info"))
    for row in raw.get("compute", []):
        add_metric(doc, f"batching/compute/sessions={row['sessions']}", "compute_speedup",
                   metric(row["compute_speedup"], kind="info"))
    return doc
