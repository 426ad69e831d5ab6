"""Which thread a body forward runs on, and what it costs: the process's main thread against a worker thread.

``python -m benchmarks.compute_thread [--model default] [--split 2,2] [--steps 60] [--repeats 3]``

Loads the model on the main thread (as ``splitinfer serve`` does), then times
single-token steps of the body (median ms over ``steps``, a cache of 64
positions, cropped back after each step) alternately on the main thread and
on one worker thread of a :class:`~concurrent.futures.ThreadPoolExecutor`
(as the server's request threads were), ``repeats`` times each. With
PyTorch's OpenMP backend each application thread that runs parallel work
gets an OpenMP pool of its own; on the 2-core machine of the reports the
worker thread's step was about 1.6x the main thread's, which is why
``serve`` computes on its main thread (:mod:`splitinfer.batch_scheduler`,
"Which thread computes"). A benchmark that prints figures: run it alone
(under the heavy lock), with ``OMP_NUM_THREADS`` set as the server would be.
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from splitinfer.kv_cache import PartKVCache
from splitinfer.models import load_model
from splitinfer.partition import CloudBody, SplitConfig

CONTEXT = 64


def step_timer(model: str, split: str, steps: int):
    """A function that times ``steps`` single-token body steps on the calling thread (median ms)."""
    loaded = load_model(model)
    body = CloudBody.from_model(loaded.model, SplitConfig.parse(split))
    gen = torch.Generator().manual_seed(0)
    cache = PartKVCache()
    body(torch.randn(1, CONTEXT, loaded.hidden_size, generator=gen), torch.arange(CONTEXT), cache)  # (1, 64, d)
    x = torch.randn(1, 1, loaded.hidden_size, generator=gen)  # (1, 1, d): one new position
    position = torch.tensor([CONTEXT])

    @torch.no_grad()
    def timed() -> float:
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            body(x, position, cache)
            times.append(1e3 * (time.perf_counter() - t0))
            cache.crop(CONTEXT)
        return statistics.median(times)

    return timed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--split", default="2,2")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        ap.error("--steps and --repeats must be >= 1")
    timed = step_timer(args.model, args.split, args.steps)
    pool = ThreadPoolExecutor(1, thread_name_prefix="worker")
    rows = {"main": [], "worker": []}
    timed(), pool.submit(timed).result()  # warm-up: each thread's first parallel region starts its pool
    for _ in range(args.repeats):
        rows["main"].append(timed())
        rows["worker"].append(pool.submit(timed).result())
    pool.shutdown()
    print(f"single-token body step, model {args.model} split {args.split}, cache {CONTEXT}, torch threads "
          f"{torch.get_num_threads()}, median ms of {args.steps} steps per repeat:")
    for name, values in rows.items():
        print(f"  {name:>6} thread: " + "  ".join(f"{v:.1f}" for v in values))
    ratio = statistics.median(rows["worker"]) / statistics.median(rows["main"])
    print(f"  worker / main (medians over repeats): {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
