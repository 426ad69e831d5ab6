"""The batch scheduler (:mod:`splitinfer.batch_scheduler`): gathering, caps, failures, the unbatched path."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from splitinfer import batch_invariant as bi
from splitinfer.batch_scheduler import BatchConfig, BatchScheduler
from splitinfer.errors import SplitInferError
from splitinfer.kv_cache import PartKVCache
from splitinfer.packed_body import BodyStep
from splitinfer.partition import SplitConfig, split_model

LONG = 1000.0  # ms (the largest allowed): a window the tests do not wait out (the scheduler stops once every caller is pending)


@pytest.fixture(scope="module")
def body(tiny):
    _, body, _ = split_model(copy.deepcopy(tiny.model), SplitConfig(2, 2))
    bi.enable(body)  # bit-identical packed forwards: results compare with torch.equal
    return body


def _step(body, cached: int, rows: int, seed: int, max_len: int | None = None) -> BodyStep:
    gen = torch.Generator().manual_seed(seed)
    d = body.config.hidden_size
    cache = PartKVCache()
    if cached:
        body(torch.randn(1, cached, d, generator=gen), torch.arange(cached), cache)
    cache.max_len = max_len
    return BodyStep(torch.randn(1, rows, d, generator=gen), torch.arange(cached, cached + rows), cache)


def _run_all(scheduler, steps):
    """Submit every step from its own thread at once; return (results, errors) in step order."""
    results, errors = [None] * len(steps), [None] * len(steps)

    def call(i):
        try:
            results[i] = scheduler.run(steps[i])
        except Exception as e:  # noqa: BLE001 - the test inspects it
            errors[i] = e

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(steps))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results, errors


SHAPES = [(3, 1), (7, 1), (0, 5), (2, 2)]  # (cached, rows): ragged lengths, a prefill among them


def test_concurrent_steps_run_as_one_forward_and_match_one_forward_each(body):
    scheduler = BatchScheduler(body, BatchConfig(max_batch=8, window_ms=LONG), lambda: len(SHAPES))
    steps = [_step(body, c, r, i) for i, (c, r) in enumerate(SHAPES)]
    results, errors = _run_all(scheduler, steps)
    assert errors == [None] * len(SHAPES)
    assert scheduler.counts["forwards"] == 1 and [r.batch for r in results] == [len(SHAPES)] * len(SHAPES)
    for i, (c, r) in enumerate(SHAPES):
        alone = _step(body, c, r, i)
        expected = body(alone.hidden, alone.positions, alone.cache)
        assert torch.equal(results[i].out, expected)
        assert len(steps[i].cache) == c + r
        assert all(torch.equal(steps[i].cache.keys[k], alone.cache.keys[k]) for k in alone.cache.keys)
    scheduler.close()


def test_max_batch_and_max_rows_cap_each_forward(body):
    scheduler = BatchScheduler(body, BatchConfig(max_batch=2, window_ms=LONG), lambda: 6)
    results, errors = _run_all(scheduler, [_step(body, 2, 1, i) for i in range(6)])
    assert errors == [None] * 6 and max(r.batch for r in results) <= 2 and scheduler.counts["forwards"] >= 3
    scheduler.close()
    scheduler = BatchScheduler(body, BatchConfig(max_batch=8, window_ms=0, max_rows=4), lambda: 3)
    results, errors = _run_all(scheduler, [_step(body, 2, 3, i) for i in range(3)])
    assert errors == [None] * 3 and [r.batch for r in results] == [1, 1, 1]  # 3 + 3 rows > 4
    scheduler.close()


def test_a_failing_session_does_not_corrupt_the_others(body):
    scheduler = BatchScheduler(body, BatchConfig(max_batch=8, window_ms=LONG), lambda: 3)
    steps = [_step(body, 3, 1, 0), _step(body, 4, 2, 1, max_len=5), _step(body, 5, 1, 2)]  # the middle one overflows
    results, errors = _run_all(scheduler, steps)
    assert isinstance(errors[1], SplitInferError) and "--max-context" in str(errors[1])
    assert errors[0] is None and errors[2] is None and scheduler.counts["fallbacks"] == 1
    for i, (c, r, seed) in ((0, (3, 1, 0)), (2, (5, 1, 2))):
        alone = _step(body, c, r, seed)
        assert torch.equal(results[i].out, body(alone.hidden, alone.positions, alone.cache))
        assert len(steps[i].cache) == c + r and torch.equal(steps[i].cache.positions, alone.cache.positions)
        assert all(torch.equal(steps[i].cache.values[k], alone.cache.values[k]) for k in alone.cache.values)
    scheduler.close()


def test_a_session_whose_result_overflows_is_refused_alone(body):
    """Issue 30, finding 1: a step whose output or new KV is NaN/Inf (its cache overflowed) is refused; the
    other steps of the same packed forward keep their results (before: NaN for everyone, no error)."""
    scheduler = BatchScheduler(body, BatchConfig(max_batch=8, window_ms=LONG), lambda: 3)
    steps = [_step(body, 3, 1, 0), _step(body, 4, 1, 1), _step(body, 5, 1, 2)]
    for k in steps[1].cache.keys:  # the middle session's cache already holds an overflow
        steps[1].cache.keys[k][..., 0] = float("inf")
    results, errors = _run_all(scheduler, steps)
    assert isinstance(errors[1], SplitInferError) and "NaN or Inf" in str(errors[1])
    assert errors[0] is None and errors[2] is None and results[0].batch == 3
    for i, (c, r) in ((0, (3, 1)), (2, (5, 1))):
        alone = _step(body, c, r, i)
        assert torch.equal(results[i].out, body(alone.hidden, alone.positions, alone.cache))
    scheduler.close()


class _Gate(torch.nn.Module):
    """A body whose forwards of more than one row wait for ``release`` (a long prefill, held)."""

    def __init__(self, body):
        super().__init__()
        self.inner, self.release, self.entered = body, threading.Event(), threading.Event()

    def forward(self, hidden, positions, cache, parents=None):
        if hidden.shape[1] > 1:
            self.entered.set()
            assert self.release.wait(30)
        return self.inner(hidden, positions, cache, parents)


def test_a_long_step_runs_beside_the_batches_not_ahead_of_them(body):
    """Issue 30, finding 2: a step of more than max_step_rows rows must not hold the batching thread (before,
    a victim's single-token step waited for every long prefill queued ahead of it)."""
    gate = _Gate(body)
    scheduler = BatchScheduler(gate, BatchConfig(max_batch=8, window_ms=0, max_step_rows=4), lambda: 2)
    long_done = []
    t = threading.Thread(target=lambda: long_done.append(scheduler.run(_step(body, 0, 8, 0))))
    t.start()
    assert gate.entered.wait(30)
    small = threading.Thread(target=lambda: long_done.append(scheduler.run(_step(body, 2, 1, 1)).batch))
    small.start()
    small.join(10)
    finished_first = not small.is_alive()
    gate.release.set()
    t.join(30)
    small.join(30)
    assert finished_first and long_done[0] == 1  # the small step was answered while the long one was held
    scheduler.close()


def test_unbatched_runs_in_the_callers_thread(body):
    scheduler = BatchScheduler(body, BatchConfig(max_batch=1), lambda: 4)
    step, alone = _step(body, 3, 2, 0), _step(body, 3, 2, 0)
    assert torch.equal(scheduler.run(step).out, body(alone.hidden, alone.positions, alone.cache))
    assert scheduler._thread is None and scheduler.counts["forwards"] == 0


class _ThreadRecordingBody:
    """Wraps a body; records the thread each of its forwards ran on."""

    def __init__(self, body):
        self.body, self.config, self.threads = body, body.config, []
        self._lock = threading.Lock()

    def __call__(self, *args, **kwargs):
        with self._lock:
            self.threads.append(threading.current_thread().name)
        return self.body(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.body, name)


def _hosted(scheduler):
    """Host ``scheduler``'s loop on a thread named 'host' (as serve hosts it on the main thread)."""
    bound = threading.Event()
    host = threading.Thread(target=scheduler.host, kwargs={"then": bound.set}, name="host")
    host.start()
    assert bound.wait(30)
    return host


@pytest.mark.parametrize("max_batch", [1, 8])
def test_a_hosted_scheduler_computes_every_small_step_on_the_hosting_thread(body, max_batch):
    recorder = _ThreadRecordingBody(body)
    scheduler = BatchScheduler(recorder, BatchConfig(max_batch=max_batch, window_ms=0, max_step_rows=4), lambda: 4)
    host = _hosted(scheduler)
    steps = [_step(body, c, r, i) for i, (c, r) in enumerate(SHAPES)]
    alone = [_step(body, c, r, i) for i, (c, r) in enumerate(SHAPES)]
    results, errors = _run_all(scheduler, steps)
    scheduler.close()
    host.join(30)
    assert not host.is_alive() and errors == [None] * 4  # close() ends host()
    for got, ref in zip(results, alone):
        assert torch.equal(got.out, body(ref.hidden, ref.positions, ref.cache))
    assert scheduler.compute_thread == "host"
    assert sum(t != "host" for t in recorder.threads) == 1  # only the 5-row prefill ran on its caller's thread
    if max_batch == 1:  # unbatched and hosted: the three small steps one by one, on the host
        assert recorder.threads.count("host") == 3 and scheduler.counts["steps"] == 3


def test_a_hosted_scheduler_runs_long_steps_one_at_a_time_on_their_callers_threads(body):
    """Beside the hosted loop, long steps must not run side by side (each on one intra-op thread under serve;
    together they crowded the cores the loop computes on: a victim's p50 went from 10.9 to 60.1 ms)."""
    gate = _Gate(body)
    gate.config = body.config
    recorder = _ThreadRecordingBody(gate)  # records the thread before the gate holds it
    scheduler = BatchScheduler(recorder, BatchConfig(max_batch=8, window_ms=0, max_step_rows=4), lambda: 3)
    host = _hosted(scheduler)
    finished = []
    longs = [threading.Thread(target=lambda i=i: finished.append(scheduler.run(_step(body, 0, 8, i))), name=f"L{i}")
             for i in range(2)]
    for t in longs:
        t.start()
    assert gate.entered.wait(30)
    threading.Event().wait(0.3)  # time for the second long step to reach the body, were it allowed
    assert sum(t.startswith("L") for t in recorder.threads) == 1  # the other waits its turn
    small = scheduler.run(_step(body, 2, 1, 5))  # the hosted loop answers small steps meanwhile
    assert small.batch == 1
    gate.release.set()
    for t in longs:
        t.join(30)
    scheduler.close()
    host.join(30)
    assert len(finished) == 2 and sorted(t for t in recorder.threads if t.startswith("L")) == ["L0", "L1"]


def test_host_refuses_once_the_scheduler_runs_a_thread_of_its_own(body):
    scheduler = BatchScheduler(body, BatchConfig(max_batch=8, window_ms=0), lambda: 1)
    scheduler.run(_step(body, 1, 1, 0))  # starts the scheduler's own thread
    with pytest.raises(SplitInferError, match="before the first step"):
        scheduler.host()
    scheduler.close()


def test_a_lone_step_does_not_wait_for_callers_that_never_come(body):
    scheduler = BatchScheduler(body, BatchConfig(max_batch=8, window_ms=0), lambda: 50)
    assert scheduler.run(_step(body, 1, 1, 0)).batch == 1
    scheduler.close()
    with pytest.raises(SplitInferError, match="shutting down"):
        scheduler.run(_step(body, 1, 1, 0))


@pytest.mark.parametrize("config, message", [(BatchConfig(max_batch=0), "--max-batch"),
                                             (BatchConfig(window_ms=-1), "--batch-window-ms")])
def test_bad_settings_are_one_line_errors(config, message):
    with pytest.raises(SplitInferError, match=message):
        config.validate()
