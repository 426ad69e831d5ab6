"""Continuous batching over sessions: collect the body steps that are ready, run them as one forward.

The service's worker threads (one per request in flight) hand their session's
body step to :meth:`BatchScheduler.run` and wait. One scheduler thread
takes the pending steps, oldest first, as one batch of at most ``max_batch``
steps and ``max_rows`` rows, runs it through
:func:`splitinfer.packed_body.run_packed` and answers every waiting worker.
Steps that arrive during a forward wait for the next one, so sessions join
and leave between any two steps (continuous batching, Yu et al., "Orca",
OSDI 2022; here at the granularity of whole body steps).

**The window.** The scheduler waits up to ``window_ms`` for more steps,
counted from the arrival of the oldest pending step or from the end of the
previous forward, whichever is later, but stops as soon as as many steps are
pending as there are callers it expects (``active_callers``; the service
counts connections with a forward in flight plus those answered less than
the window ago, which are likely to send their next step within it), capped
at ``max_batch``. Counting from the end of the previous forward lets the
sessions just answered send their next step and join the steps that queued
during that forward; counting only from the oldest arrival split 8 lockstep
sessions into two alternating half batches (measured: 4 steps per forward;
``reports/server_batching``). A connection that holds a session but sends
nothing is not expected, so it costs nobody the window (issue 30, finding 4:
one idle session raised a victim's p50 from 2.2 to 303.6 ms at a 300 ms
window when open sessions were counted).

**Fairness.** A step of more than ``max_step_rows`` rows (a long prefill, a
large draft tree) does not enter the batching path: it runs on the caller's
own thread beside the batches, so a 4,096-token prefill cannot hold up every
other tenant's single-token steps for its whole duration (issue 30, finding
2). Under ``serve`` (a hosted loop) such steps run one at a time, each on one
intra-op thread (see "Which thread computes"); side by side they crowded the
cores the loop computes on. With four tenants repeating 4,096-token prefills
on the tiny model a victim's single-token step took 48.7 ms at p50 batched
(60.1 ms with the long steps side by side, 22.7 ms when every forward ran on
request threads) and the tenants' prefills 393 ms (236 ms before): the cost of
keeping the long steps off the main thread's cores
(``reports/server_batching/report.md``, "Long prefills beside single-token
steps"). The batching path holds only small steps, served oldest first; each
connection has at most one request in flight (the server answers a
connection's frames in order), so oldest-first is round robin over the
connections. Deviation from Orca and vLLM: long prompts are not
chunked into the batches (chunked prefill on the computing thread would give
them both cores; with the default kernels it would also change their states
by float noise, as batching does).

**Isolation.** Every step's output and the KV entries it appended are
checked for NaN/Inf after its forward (packed or not); a step that fails is
refused (its caller rolls its cache back) while the other steps of the same
packed forward get their results. Attention is per session
(:mod:`splitinfer.packed_body`), so one session's values never enter
another's arithmetic.

**Which thread computes.** Every step that enters the batching path runs on
one thread, the scheduler's; ``splitinfer serve`` makes that the process's
main thread (:meth:`BatchScheduler.host`), with the event loop on a second
thread and the request threads kept to one intra-op thread each
(``splitinfer.server._single_intra_op_thread``), so that only one thread ever
runs parallel tensor work. With PyTorch's OpenMP backend each application
thread that runs parallel work gets an OpenMP pool of its own, and once there
are two, every thread's parallel work slows down: on the 2-core machine the
reports come from, a single-token step of the default model's body took
27.7-28.0 ms on the main thread, 47.1-48.8 ms on a worker thread, 49.4-50.2 ms
on the main thread once a worker had cast one 4,096 x 576 frame, and
28.4-28.8 ms beside a worker kept to one intra-op thread (``python -m
benchmarks.compute_thread``, ``reports/server_batching/report.md``). The
server's request threads used to run the forwards (and cast every frame), so
every step paid this: a lone step through the server took 47.6 ms at p50,
28.7 ms since.

**Exactness.** A batch of one step runs ``body(...)`` exactly as the
unbatched server does. If a packed forward raises (e.g. one session's cache
refuses to grow), every session's cache is cropped back to its length before
the batch and each step is run again on its own, so a failing session gets
its error and the others their results, with caches as if they had never
been batched. ``max_batch=1`` is the unbatched server: under ``serve`` the
hosting thread runs the steps one at a time, oldest first, never two forwards
at once; with no host (an in-process :class:`~splitinfer.session.BodyService`)
each caller runs its own step on its own thread, as before this module existed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from splitinfer.errors import SplitInferError
from splitinfer.packed_body import BodyStep, run_packed
from splitinfer.partition import CloudBody

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchConfig:
    """``--max-batch`` (1 = unbatched), ``--batch-window-ms`` and the rows one packed forward may hold."""

    max_batch: int = 16
    window_ms: float = 5.0
    max_rows: int = 512
    max_step_rows: int = 128  # a larger step runs beside the batches, on its caller's thread (fairness)

    def validate(self) -> None:
        if self.max_batch < 1:
            raise SplitInferError(f"--max-batch {self.max_batch}: must be >= 1 (1 = no batching)")
        if not 0 <= self.window_ms <= 1000:
            raise SplitInferError(f"--batch-window-ms {self.window_ms:g}: must be in [0, 1000]")
        if self.max_rows < 1:
            raise SplitInferError(f"max_rows {self.max_rows}: must be >= 1")
        if self.max_step_rows < 1:
            raise SplitInferError(f"max_step_rows {self.max_step_rows}: must be >= 1")


@dataclass
class _Pending:
    step: BodyStep
    since: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    out: torch.Tensor | None = None
    error: BaseException | None = None
    batch: int = 1  # steps in the forward that answered it
    compute_s: float = 0.0  # that forward's time


@dataclass
class StepResult:
    out: torch.Tensor  # (1, T, d)
    compute_s: float  # the forward that computed it (shared by its batch)
    queue_s: float  # waiting before that forward started
    batch: int  # steps in that forward


class BatchScheduler:
    """Runs :class:`BodyStep` s for many threads, packing those that are ready into one forward."""

    def __init__(self, body: CloudBody, config: BatchConfig = BatchConfig(),
                 active_callers: Callable[[], int] = lambda: 1):
        config.validate()
        self.body, self.config, self._active = body, config, active_callers
        self._cv = threading.Condition()
        self._pending: list[_Pending] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self._last_end = 0.0  # monotonic time the previous forward ended
        self._hosted = False  # a caller's thread runs the loop (host()); no thread of our own is started
        self._long_gate = threading.Lock()  # hosted: long steps run on their callers' threads one at a time
        self.compute_thread: str | None = None  # name of the thread the batching path computes on
        self.counts = {"forwards": 0, "steps": 0, "fallbacks": 0}  # packed-or-single forwards, steps answered

    # ---------------------------------------------------------------- callers
    def run(self, step: BodyStep) -> StepResult:
        """Compute ``step`` (appending to its cache); raise what its forward raised.

        A step whose output or new KV entries are not finite raises :class:`SplitInferError`
        (the caller crops the cache back).
        """
        large = step.rows > min(self.config.max_step_rows, self.config.max_rows)
        if large and self._hosted:  # one long step at a time beside the hosted loop (see "Fairness")
            with self._long_gate:
                return self._run_here(step)
        if large or (self.config.max_batch == 1 and not self._hosted):  # on the caller's own thread
            return self._run_here(step)
        item = _Pending(step)
        with self._cv:
            if self._closed:
                raise SplitInferError("the server is shutting down")
            if self._thread is None and not self._hosted:
                self._thread = threading.Thread(target=self._loop, name="body-batcher", daemon=True)
                self._thread.start()
            self._pending.append(item)
            self._cv.notify_all()
        item.done.wait()
        if item.error is not None:
            raise item.error
        queue_s = max(0.0, time.monotonic() - item.since - item.compute_s)
        return StepResult(item.out, item.compute_s, queue_s, item.batch)

    def _run_here(self, step: BodyStep) -> StepResult:
        """Compute ``step`` whole on the calling thread."""
        base = len(step.cache)
        t0 = time.perf_counter()
        out = self.body(step.hidden, step.positions, step.cache, step.parents)
        compute_s = time.perf_counter() - t0
        _raise_unless_finite(step, out, base)
        return StepResult(out, compute_s, 0.0, 1)

    @property
    def hosted(self) -> bool:
        """A caller's thread runs the loop (:meth:`host`)."""
        return self._hosted

    def host(self, then: Callable[[], None] = lambda: None) -> None:
        """Run the scheduler's loop on the calling thread until :meth:`close`.

        ``then`` is called once the steps are bound to this thread and before the loop starts (``serve`` starts
        its event loop there, so no step can arrive before). ``splitinfer serve`` calls it from the process's
        main thread, where a forward runs at full speed (module docstring: "Which thread computes").
        """
        with self._cv:
            if self._thread is not None:
                raise SplitInferError("the batch scheduler already computes on a thread of its own; host() must "
                                      "be called before the first step")
            self._hosted = True
        then()
        self._loop()

    def close(self) -> None:
        """Stop the scheduler's loop once the pending steps are answered."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # ---------------------------------------------------------------- the scheduler thread
    def _loop(self) -> None:
        self.compute_thread = threading.current_thread().name
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait(1.0)  # bounded: a hosting main thread stays responsive to signals
                if not self._pending:
                    return
                deadline = max(self._pending[0].since, self._last_end) + self.config.window_ms / 1e3
                while len(self._pending) < self._enough() and (left := deadline - time.monotonic()) > 0:
                    self._cv.wait(left)
                batch = self._take()
            try:
                self._execute(batch)
                self._last_end = time.monotonic()
            except BaseException as e:  # never leave a worker waiting, never let the thread die
                log.exception("batch scheduler failed")
                for item in batch:
                    if not item.done.is_set():
                        item.error = e
                        item.done.set()

    def _enough(self) -> int:
        try:
            callers = int(self._active())
        except Exception:
            callers = self.config.max_batch
        return max(1, min(self.config.max_batch, callers))

    def _take(self) -> list[_Pending]:
        """Oldest first: at most ``max_batch`` steps and ``max_rows`` rows (the oldest step always goes)."""
        batch, rest, rows = [], [], 0
        for item in self._pending:
            fits = len(batch) < self.config.max_batch and rows + item.step.rows <= self.config.max_rows
            if not batch or fits:
                batch.append(item)
                rows += item.step.rows
            else:
                rest.append(item)
        self._pending = rest
        return batch

    def _execute(self, batch: list[_Pending]) -> None:
        self.counts["forwards"] += 1
        bases = [len(item.step.cache) for item in batch]
        if len(batch) > 1:
            t0 = time.perf_counter()
            try:
                outs = run_packed(self.body, [item.step for item in batch])
            except Exception as e:
                for item, base in zip(batch, bases):
                    item.step.cache.crop(base)  # as if the packed forward had never run
                log.info("a packed forward of %d steps failed (%s); running them one by one", len(batch),
                         str(e)[:200])
                self.counts["fallbacks"] += 1
            else:
                compute_s = time.perf_counter() - t0
                for item, out, base in zip(batch, outs, bases):
                    item.out, item.compute_s, item.batch = out, compute_s, len(batch)
                    try:
                        _raise_unless_finite(item.step, out, base)
                    except SplitInferError as e:
                        item.error = e  # this session alone; the caller crops its cache back
                    self.counts["steps"] += 1
                    item.done.set()
                return
        for item, base in zip(batch, bases):  # one step, or the packed forward failed: each on its own
            t0 = time.perf_counter()
            try:
                item.out = self.body(item.step.hidden, item.step.positions, item.step.cache, item.step.parents)
                _raise_unless_finite(item.step, item.out, base)
            except Exception as e:
                item.error = e
            item.compute_s = time.perf_counter() - t0
            self.counts["steps"] += 1
            item.done.set()


def _raise_unless_finite(step: BodyStep, out: torch.Tensor, base: int) -> None:
    """Raise SplitInferError when ``out`` (1, T, d) or the KV entries ``step`` appended after ``base`` hold NaN/Inf."""
    cache = step.cache
    parts = [out] + [t[:, :, base:] for d in (cache.keys, cache.values) for t in d.values()]  # (1, H_kv, T, D_h)
    if all(bool(torch.isfinite(t).all()) for t in parts):
        return
    raise SplitInferError("the body's result for this step holds NaN or Inf values (its values overflow the "
                          "body's dtype); the step was refused and the session's cache left as it was before it")
