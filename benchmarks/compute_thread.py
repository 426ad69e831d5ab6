"""Which thread a body forward runs on, and what a second thread's tensor work costs the first.

``python -m benchmarks.compute_thread [--model default] [--split 2,2] [--steps 60] [--repeats 3]``

Each case runs in a fresh process that loads the model on its main thread (as
``splitinfer serve`` does) and times single-token steps of the body (median ms
of ``steps``, a cache of 64 positions cropped back after each step),
``repeats`` times:

- ``main``: on the main thread, no other thread has done tensor work;
- ``worker``: on a worker thread of a :class:`~concurrent.futures.ThreadPoolExecutor`
  (as the server's request threads ran the forwards before);
- ``main after worker``: on the main thread, after a worker thread has cast one
  4,096 x 576 fp16 tensor to fp32 (what a request thread did with a long
  prefill's frame) and gone idle;
- ``main beside 1-thread worker``: the same, the worker first limited to one
  intra-op thread (``torch.set_num_threads(1)`` on that thread), as ``serve``'s
  request threads are now.

With PyTorch's OpenMP backend each application thread that runs parallel work
gets an OpenMP pool of its own; once there are two, every thread's parallel
work is slower. Why ``serve`` computes on its main thread and keeps its request
threads to one intra-op thread: :mod:`splitinfer.batch_scheduler`, "Which thread
computes". A benchmark that prints figures: run it alone (under the heavy lock),
with ``OMP_NUM_THREADS`` set as the server's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from splitinfer.cli_flags import positive_int
from splitinfer.kv_cache import PartKVCache
from splitinfer.models import load_model
from splitinfer.partition import CloudBody, SplitConfig

CONTEXT = 64
CASES = ("main", "worker", "main after worker", "main beside 1-thread worker")


def step_timer(model: str, split: str, steps: int):
    """A function that times ``steps`` single-token body steps on the calling thread (median ms)."""
    loaded = load_model(model)
    body = CloudBody.from_model(loaded.model, SplitConfig.parse(split))
    gen = torch.Generator().manual_seed(0)
    cache = PartKVCache()
    body(torch.randn(1, CONTEXT, loaded.hidden_size, generator=gen), torch.arange(CONTEXT), cache)  # (1, 64, d)
    x = torch.randn(1, 1, loaded.hidden_size, generator=gen)  # (1, 1, d): one new position
    position = torch.tensor([CONTEXT])

    def timed() -> float:
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            body(x, position, cache)
            times.append(1e3 * (time.perf_counter() - t0))
            cache.crop(CONTEXT)
        return statistics.median(times)

    return timed


def run_case(case: str, model: str, split: str, steps: int, repeats: int) -> list[float]:
    """The medians of one case, in this process (call it in a fresh one: a case changes the process)."""
    timed = step_timer(model, split, steps)
    pool = ThreadPoolExecutor(1, thread_name_prefix="worker")
    frame = torch.randn(4096, 576).half()  # a long prefill's frame as it arrives

    def cast_on_one_thread() -> None:
        torch.set_num_threads(1)
        frame.float()

    if case == "worker":
        pool.submit(timed).result()  # warm-up
        return [pool.submit(timed).result() for _ in range(repeats)]
    timed()  # warm-up on the main thread
    if case == "main after worker":
        pool.submit(frame.float).result()
    elif case == "main beside 1-thread worker":
        pool.submit(cast_on_one_thread).result()
    return [timed() for _ in range(repeats)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--split", default="2,2")
    ap.add_argument("--steps", type=positive_int, default=60)
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one case, in this process (JSON out)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        ap.error("--steps and --repeats must be >= 1")
    if args.case:
        print(json.dumps(run_case(args.case, args.model, args.split, args.steps, args.repeats)))
        return 0
    rows = {}
    for case in CASES:
        cmd = [sys.executable, "-m", "benchmarks.compute_thread", "--model", args.model, "--split", args.split,
               "--steps", str(args.steps), "--repeats", str(args.repeats), "--case", case]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"error: case {case!r} failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return 1
        rows[case] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"single-token body step, model {args.model} split {args.split}, cache {CONTEXT}, torch threads "
          f"{torch.get_num_threads()}, median ms of {args.steps} steps, {args.repeats} repeats, a fresh process "
          "per case:")
    for case, values in rows.items():
        print(f"  {case:>28}: " + "  ".join(f"{v:.1f}" for v in values))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
