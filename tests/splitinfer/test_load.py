"""Bounded load (issue 3 §7): 8 concurrent clients x 64 tokens and a burst of 100 short sessions against
one server process; every output equals the single-client output, sessions return to 0, memory stays
near its baseline, idle sessions expire on time."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from splitinfer.client import SplitModel
from splitinfer.protocol import encode_frame
from splitinfer.ws_link import WebSocketLink
from tests.splitinfer.ws_helpers import RawClient, ServerProcess, server_stats, wait_for

PROMPTS = ["Once upon a time", "def add(a, b):", '{"name": "Ada",', "Q: What is 2+2?\nA:",
           "The weather today", "import numpy as np", "Dear Sir or Madam,", "1, 2, 3, 4,"]
IDLE_S = 1.5


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    proc = ServerProcess(tiny_dir, "--stats-all", "--idle-timeout-s", str(IDLE_S), "--workers", "4",
                         log_dir=tmp_path_factory.mktemp("logs")).wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def references(tiny):
    sm = SplitModel(tiny, "2,2")
    return {p: sm.generate(p, 64, stop_on_eos=False).token_ids for p in PROMPTS}


def _settled(url: str) -> dict:
    stats = wait_for(lambda: (lambda s: s if s["sessions"] == 0 and s["connections"] == 1 else None)(server_stats(url)))
    assert stats, server_stats(url)
    return stats


@pytest.mark.slow  # `make test-all` (not in CI: the 20-minute budget)
def test_concurrent_clients_and_a_burst_of_short_sessions(tiny, server, references):
    warm = SplitModel(tiny, "2,2", cloud=WebSocketLink(server.url))
    warm.generate(PROMPTS[0], 8)
    warm.close()
    baseline = _settled(server.url)

    def client(prompt):  # each client: its own connection and session
        sm = SplitModel(tiny, "2,2", cloud=WebSocketLink(server.url))
        try:
            return sm.generate(prompt, 64, stop_on_eos=False).token_ids
        finally:
            sm.close()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(client, PROMPTS))
    concurrent_s = time.perf_counter() - t0
    assert outs == [references[p] for p in PROMPTS]

    def burst(worker):  # 10 workers x 10 short sessions: half on fresh connections, half on one connection
        link = WebSocketLink(server.url)
        shared = SplitModel(tiny, "2,2", cloud=link)
        got = []
        for j in range(10):
            prompt = PROMPTS[(worker + j) % len(PROMPTS)]
            if j % 2:
                got.append((prompt, shared.generate(prompt, 4, stop_on_eos=False).token_ids))
            else:
                got.append((prompt, client_short(prompt)))
        link.close()
        return got

    def client_short(prompt):
        sm = SplitModel(tiny, "2,2", cloud=WebSocketLink(server.url))
        try:
            return sm.generate(prompt, 4, stop_on_eos=False).token_ids
        finally:
            sm.close()

    with ThreadPoolExecutor(10) as pool:
        results = [r for rs in pool.map(burst, range(10)) for r in rs]
    assert len(results) == 100
    assert all(ids == references[p][:4] for p, ids in results)

    after = _settled(server.url)
    assert after["sessions"] == 0 and after["kv_bytes"] == 0
    assert after["sessions_opened"] - baseline["sessions_opened"] == 108
    assert after["rss_bytes"] - baseline["rss_bytes"] < 150 * 2**20, (baseline["rss_bytes"], after["rss_bytes"])
    assert concurrent_s < 60


def test_idle_sessions_expire_on_time(server, tiny):
    c = RawClient(server.url)
    sids = [c.open() for _ in range(3)]
    hidden = torch.zeros(1, 2, tiny.hidden_size, dtype=torch.float16)
    first = encode_frame("forward", {"session": sids[0], "positions": [0, 1]}, {"hidden": hidden})
    assert c.request(first).op == "result"
    assert c.stats()["sessions"] == 3
    t0 = time.monotonic()
    gone = wait_for(lambda: c.stats()["sessions"] == 0, timeout=IDLE_S + 5, interval=0.05)
    waited = time.monotonic() - t0
    assert gone and IDLE_S - 0.2 <= waited <= IDLE_S + 1.5, waited
    late = c.request(encode_frame("forward", {"session": sids[0], "positions": [2]}, {"hidden": hidden[:, :1]}))
    assert late.op == "error" and "unknown, closed or expired session" in late.fields["message"]
    assert c.stats()["kv_bytes"] == 0
    c.close()


def test_compute_does_not_block_other_clients(tiny, server):
    """While one client streams, another's stats round trips stay fast (compute runs off the event loop)."""
    stop = threading.Event()

    def busy():
        sm = SplitModel(tiny, "2,2", cloud=WebSocketLink(server.url))
        while not stop.is_set():
            sm.generate(PROMPTS[1], 16, stop_on_eos=False)
        sm.close()

    t = threading.Thread(target=busy)
    t.start()
    try:
        c = RawClient(server.url)
        worst = 0.0
        for _ in range(20):
            t0 = time.perf_counter()
            c.stats()
            worst = max(worst, time.perf_counter() - t0)
        c.close()
    finally:
        stop.set()
        t.join()
    assert worst < 1.0
