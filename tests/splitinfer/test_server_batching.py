"""A real ``splitinfer serve`` that batches its sessions: identical to unbatched, bit for bit with --batch-invariant.

Sessions of different lengths join and leave mid-generation: some start only
once another has done a few steps, and they stop after different numbers of
steps. The unbatched reference is the same frames sent one session at a time
(to a ``--max-batch 1`` server with --batch-invariant, to the same server
otherwise: a batch of one runs the unbatched path).
"""

from __future__ import annotations

import threading

import pytest
import torch

from splitinfer.client import SplitModel
from splitinfer.protocol import encode_frame
from splitinfer.ws_link import WebSocketLink
from tests.splitinfer.ws_helpers import RawClient, ServerProcess, server_stats

D = 64
BATCH = ["--max-batch", "8", "--batch-window-ms", "300", "--stats-all"]


@pytest.fixture(scope="module")
def servers(tiny_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("batching")
    procs = {"batched": ServerProcess(tiny_dir, *BATCH, log_dir=tmp),
             "bi-batched": ServerProcess(tiny_dir, "--batch-invariant", *BATCH, log_dir=tmp),
             "bi-unbatched": ServerProcess(tiny_dir, "--batch-invariant", "--max-batch", "1", "--stats-all",
                                           log_dir=tmp)}
    try:  # a server that is slow to start must not outlive the run (it did: 3 orphans after a timeout)
        for p in procs.values():
            p.wait_ready()
        yield procs
    finally:
        for p in procs.values():
            p.stop()


def _script(seed: int, prefill: int, steps: int) -> list[tuple[dict, torch.Tensor | None]]:
    """One session's requests: a prefill, single-token steps, a draft tree and a keep of its accepted path,
    and a forward that skips a position (refused; it must leave the cache as it was)."""
    gen = torch.Generator().manual_seed(seed)
    out, n = [({"positions": list(range(prefill))}, torch.randn(1, prefill, D, generator=gen))], prefill
    for i in range(steps):
        if i == 1:  # a tree at depth 0, 1, 1, 2; the next forward keeps nodes 0 and 2
            out.append(({"positions": [n, n + 1, n + 1, n + 2], "parents": [-1, 0, 0, 1]},
                        torch.randn(1, 4, D, generator=gen)))
            out.append(({"positions": [n + 2], "keep": {"prefix": n, "accepted": [0, 2]}},
                        torch.randn(1, 1, D, generator=gen)))
            n += 3
        elif i == 2:
            out.append(({"positions": [n + 5]}, torch.randn(1, 1, D, generator=gen)))  # refused
        else:
            out.append(({"positions": [n]}, torch.randn(1, 1, D, generator=gen)))
            n += 1
    return out


SESSIONS = [(0, 3, 9), (1, 17, 4), (2, 8, 12), (3, 30, 6)]  # (seed, prefill, steps): joins and leaves at different times
LATE = {2, 3}  # these open their session only after session 0 has done 3 requests


def _replay(url: str, script, started: threading.Event | None = None, wait: threading.Event | None = None):
    """Run a script on its own connection; return the reply states (None for an error reply)."""
    if wait is not None:
        assert wait.wait(60)
    c = RawClient(url)
    sid = c.open()
    replies = []
    for i, (fields, hidden) in enumerate(script):
        reply = c.request(encode_frame("forward", {"session": sid, **fields}, {"hidden": hidden}))
        replies.append(reply.tensors["hidden"].clone() if reply.op == "result" else None)
        if started is not None and i == 2:
            started.set()
    c.close()
    return replies


def _concurrent(url: str) -> list[list]:
    scripts = [_script(*s) for s in SESSIONS]
    out, started = [None] * len(scripts), threading.Event()

    def run(i):
        out[i] = _replay(url, scripts[i], started if i == 0 else None, started if i in LATE else None)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(scripts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def _one_at_a_time(url: str) -> list[list]:
    return [_replay(url, _script(*s)) for s in SESSIONS]


def _batched_steps(url: str) -> int:
    """Steps answered by a forward that packed several: more steps than forwards."""
    stats = server_stats(url)
    return stats["batch_steps"] - stats["batch_forwards"]


def test_batch_invariant_server_returns_bit_identical_states(servers):
    got = _concurrent(servers["bi-batched"].url)
    want = _one_at_a_time(servers["bi-unbatched"].url)
    assert _batched_steps(servers["bi-batched"].url) > 0  # several sessions really shared forwards
    for g, w in zip(got, want):
        assert [x is None for x in g] == [x is None for x in w]  # the same requests refused
        assert sum(x is None for x in g) == 1
        assert all(x is None or torch.equal(x, y) for x, y in zip(g, w))


def test_default_kernels_agree_to_float_noise(servers):
    url = servers["batched"].url
    got, want = _concurrent(url), _one_at_a_time(url)
    assert _batched_steps(url) > 0
    diff = max(float((x - y).abs().max()) for g, w in zip(got, want) for x, y in zip(g, w) if x is not None)
    print(f"max |batched - unbatched| = {diff:.3g}")
    assert diff < 1e-3


def test_generations_are_token_identical_with_clients_joining_and_leaving(tiny, servers):
    url = servers["batched"].url
    jobs = [("Once upon a time", 24, "sequential"), ("def add(a, b):\n    return", 8, "combined"),
            ("The capital of France is the city of", 16, "sequential"), ("A", 12, "combined")]
    reference = [SplitModel(tiny, "2,2").generate(p, n, decoding=d, stop_on_eos=False).token_ids for p, n, d in jobs]
    before = _batched_steps(url)
    got, started = [None] * len(jobs), threading.Event()

    def run(i):
        prompt, n, decoding = jobs[i]
        if i in LATE:
            assert started.wait(60)
        sm = SplitModel(tiny, "2,2", cloud=WebSocketLink(url))
        seen = []

        def on_text(text):
            seen.append(text)
            if i == 0 and len(seen) == 3:
                started.set()

        try:
            got[i] = sm.generate(prompt, n, decoding=decoding, stop_on_eos=False, on_text=on_text).token_ids
        finally:
            started.set()
            sm.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert got == reference
    assert _batched_steps(url) > before


def test_the_body_computes_on_the_servers_main_thread(servers):
    """serve hosts the forwards on its main thread, where a forward runs at full speed (a pool thread of a
    process whose main thread loaded the model ran the default model's single-token step about 1.6x slower)."""
    for name in ("batched", "bi-unbatched"):
        url = servers[name].url
        _replay(url, _script(7, 3, 2))
        assert server_stats(url)["compute_thread"] == "MainThread", name
