"""Cost of one packed forward against the same steps one by one, at long contexts.

Developer note: issue 30, finding 6.

``python -m benchmarks.packed_cost [--model tiny-random] [--sessions 8] [--context 4032] [--rows 64]``
prints, for ``sessions`` sessions with ``context`` cached positions each and a
step of ``rows`` new rows each: the median wall time of one packed forward
(:func:`splitinfer.packed_body.run_packed`) and of the steps one by one, and
the peak RSS growth of each (Linux ``VmHWM``, reset before each). Run it under
the heavy lock; figures in ``docs/server.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from splitinfer.cli_flags import positive_int
from splitinfer.kv_cache import PartKVCache
from splitinfer.models import load_model
from splitinfer.packed_body import BodyStep, run_packed
from splitinfer.partition import CloudBody, SplitConfig


def _status(key: str) -> int:
    """A ``/proc/self/status`` figure in bytes (0 where there is none)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass


@torch.no_grad()
def probe(model: str, split: str, sessions: int, context: int, rows: int, repeats: int) -> dict:
    loaded = load_model(model)
    body = CloudBody.from_model(loaded.model, SplitConfig.parse(split))
    gen = torch.Generator().manual_seed(0)
    d = loaded.hidden_size
    caches = []
    for _ in range(sessions):
        cache = PartKVCache()
        body(torch.randn(1, context, d, generator=gen), torch.arange(context), cache)
        caches.append(cache)
    steps = [BodyStep(torch.randn(1, rows, d, generator=gen), torch.arange(context, context + rows), c)
             for c in caches]

    def timed(fn) -> tuple[float, int]:
        times, peaks = [], []
        for _ in range(repeats):
            _reset_peak()
            before = _status("VmRSS")
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
            peaks.append(_status("VmHWM") - before)
            for c in caches:
                c.crop(context)
        return statistics.median(times), max(peaks)

    alone_ms, alone_peak = timed(lambda: [body(s.hidden, s.positions, s.cache) for s in steps])
    packed_ms, packed_peak = timed(lambda: run_packed(body, steps))
    return {"model": model, "sessions": sessions, "context": context, "rows": rows,
            "kv_bytes": sum(c.nbytes() for c in caches), "packed_ms": packed_ms, "one_by_one_ms": alone_ms,
            "packed_peak_bytes": packed_peak, "one_by_one_peak_bytes": alone_peak}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--split", default="2,2")
    ap.add_argument("--sessions", type=positive_int, default=8)
    ap.add_argument("--context", type=positive_int, default=4032)
    ap.add_argument("--rows", type=positive_int, default=64)
    ap.add_argument("--repeats", type=positive_int, default=5)
    args = ap.parse_args(argv)
    r = probe(args.model, args.split, args.sessions, args.context, args.rows, args.repeats)
    print(f"{r['model']}: {r['sessions']} sessions x {r['context']} cached positions, {r['rows']} rows each, "
          f"KV {r['kv_bytes'] / 2**20:.1f} MiB, {torch.get_num_threads()} threads")
    print(f"packed forward: {r['packed_ms']:.1f} ms, peak RSS +{r['packed_peak_bytes'] / 2**20:.1f} MiB")
    print(f"one by one:     {r['one_by_one_ms']:.1f} ms, peak RSS +{r['one_by_one_peak_bytes'] / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
