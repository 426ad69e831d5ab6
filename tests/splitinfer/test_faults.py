"""Faults (issue 3 §5): dropped connections and restarted servers mid-generation.

In-process: a link that drops at every possible request and "restarts" the
service shows that replay rebuilds the body cache exactly (same positions,
same keys/values up to float rounding), also across token trees with keep
and crop. Real process: SIGKILL the server mid-generation, start a fresh one
on the same port, and the text equals an uninterrupted run's; a network blip
with the server alive; a server gone for good gives a clear error.
"""

from __future__ import annotations

import signal
import socket

import pytest
import torch

from splitinfer.client import SplitModel, body_info
from splitinfer.errors import SplitInferError
from splitinfer.link import InProcessLink, Link
from splitinfer.partition import CloudBody, SplitConfig
from splitinfer.remote import CloudError, ConnectionLost, RemoteBody
from splitinfer.session import BodyService
from splitinfer.ws_link import WebSocketLink
from tests.splitinfer.ws_helpers import ServerProcess, server_stats, wait_for

SPLIT = SplitConfig(2, 2)
PROMPT = "It was the best of times, it was"


class FlakyLink(Link):
    """In-process link that drops at chosen requests; reconnecting meets a freshly started (empty) service."""

    reconnectable = True

    def __init__(self, make_service, fail_at=()):
        super().__init__()
        self.make_service, self.fail_at, self.n = make_service, set(fail_at), 0
        self.service = make_service()

    def _exchange(self, frame: bytes) -> bytes:
        self.n += 1
        if self.n in self.fail_at:
            raise ConnectionLost(f"simulated drop at request {self.n}")
        return self.service.handle(frame)

    def reconnect(self) -> None:
        self.service = self.make_service()


@pytest.fixture(scope="module")
def make_service(tiny):
    body = CloudBody.from_model(tiny.model, SPLIT)
    info = body_info("tiny-random", SPLIT, body, tiny.hidden_size, tiny.num_layers)
    return lambda: BodyService(body, info)


def _script(remote: RemoteBody, d: int):
    """Chains, token trees, keep and crop, as speculative decoding uses them; yields each forward's output."""
    g = torch.Generator().manual_seed(0)

    def h(n):
        return torch.randn(1, n, d, generator=g).to(torch.float16)

    remote.hello()
    remote.open()
    yield remote.forward(h(5), [0, 1, 2, 3, 4])[0]  # prefill
    yield remote.forward(h(4), [5, 6, 6, 7], parents=[-1, 0, 0, 1])[0]  # a tree
    yield remote.forward(h(3), [7, 8, 8], parents=[-1, 0, 0], keep={"prefix": 5, "accepted": [0, 1]})[0]
    assert remote.commit(keep={"prefix": 7, "accepted": [0, 2]}) == 9  # keep path 0 -> 2 of the second tree
    yield remote.forward(h(1), [9])[0]  # sequential step: stays
    assert remote.commit(crop=8) == 8
    yield remote.forward(h(2), [8, 9])[0]


def _cache(service):
    (session,) = service.sessions.values()
    return session.cache


def test_replay_rebuilds_the_cache_exactly_after_a_drop_at_any_request(tiny, make_service):
    ref_service = make_service()
    ref = list(_script(RemoteBody(InProcessLink(ref_service)), tiny.hidden_size))
    n_requests = 1 + 1 + 5 + 2  # hello, open, 5 forwards, 2 commits
    for fail_at in range(1, n_requests + 1):
        link = FlakyLink(make_service, {fail_at})
        remote = RemoteBody(link)
        outs = list(_script(remote, tiny.hidden_size))
        assert remote.recoveries == 1, fail_at
        for a, b in zip(outs, ref):
            torch.testing.assert_close(a, b, atol=2e-3, rtol=0)  # fp16 replies: one ulp
        got, want = _cache(link.service), _cache(ref_service)
        assert got.positions.tolist() == want.positions.tolist() == list(range(10))
        for layer in want.keys:
            torch.testing.assert_close(got.keys[layer], want.keys[layer], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(got.values[layer], want.values[layer], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("decoding", ["prompt-lookup", "combined"])
def test_speculative_decoding_survives_drops(tiny, make_service, decoding):
    """Token trees, keep and crop end to end: drops during speculative decoding change nothing."""
    prompt = "one two three four, one two three four, one two three four, one two"
    ref = SplitModel(tiny, "2,2").generate(prompt, 40, stop_on_eos=False, decoding=decoding)
    link = FlakyLink(make_service, {4, 9, 15})  # each recovery takes 3 requests: hello, open, replay
    sm = SplitModel(tiny, "2,2", cloud=link)
    got = sm.generate(prompt, 40, stop_on_eos=False, decoding=decoding)
    assert got.token_ids == ref.token_ids
    assert sm.remote.recoveries == 3
    assert any(s.draft_tokens for s in got.steps[1:])  # drafts (trees) were really sent


def test_a_cache_that_cannot_be_replayed_gives_a_clear_error(tiny, make_service):
    link = FlakyLink(make_service, {5})
    remote = RemoteBody(link)
    remote.hello()
    remote.open()
    d = tiny.hidden_size
    remote.forward(torch.zeros(1, 2, d, dtype=torch.float16), [0, 1])
    remote.forward(torch.zeros(1, 3, d, dtype=torch.float16), [2, 3, 3], parents=[-1, 0, 0])
    with pytest.raises(CloudError, match="cannot rebuild its cache: draft nodes .* not one root-to-node path"):
        remote.forward(torch.zeros(1, 1, d, dtype=torch.float16), [4])  # the whole tree stayed: not a chain


def test_recovery_is_bounded(tiny, make_service):
    class DeadLink(FlakyLink):
        def reconnect(self):
            raise SplitInferError("cannot connect to the cloud at nowhere (2 attempt(s))")

    remote = RemoteBody(DeadLink(make_service, {1}))
    with pytest.raises(SplitInferError, match="cannot connect"):
        remote.hello()
    remote = RemoteBody(FlakyLink(make_service, set(range(1, 100))), max_recoveries=2)
    with pytest.raises(CloudError, match="gave up after 2 recoveries"):
        remote.hello()


# ---------------------------------------------------------------- a real server process
@pytest.fixture(scope="module")
def state(tiny_dir, tmp_path_factory):
    st = {"server": ServerProcess(tiny_dir, "--stats-all", log_dir=tmp_path_factory.mktemp("logs")).wait_ready(),
          "logs": tmp_path_factory.mktemp("logs2")}
    yield st
    st["server"].stop()


@pytest.fixture(scope="module")
def reference(tiny):
    return SplitModel(tiny, "2,2").generate(PROMPT, 40, stop_on_eos=False)


def test_server_killed_mid_generation_and_restarted(tiny, tiny_dir, state, reference):
    first = state["server"]
    link = WebSocketLink(first.url, reconnect_attempts=80, backoff_s=0.1, backoff_max_s=0.5)
    sm = SplitModel(tiny, "2,2", cloud=link)
    ids = []
    for i, ev in enumerate(sm.stream(PROMPT, 40, stop_on_eos=False)):
        ids += ev.token_ids
        if i == 15:  # kill -9 the server; a fresh one starts on the same port while the client retries
            first.stop(signal.SIGKILL)
            state["server"] = ServerProcess(tiny_dir, "--stats-all", port=first.port, log_dir=state["logs"])
    assert ids == reference.token_ids
    assert tiny.tokenizer.decode(ids, skip_special_tokens=True) == reference.text
    assert sm.remote.recoveries == 1 and link.reconnects == 1
    state["server"].wait_ready()
    sm.close()


def test_connection_drop_with_server_alive_then_server_gone(tiny, state, reference):
    server = state["server"]
    link = WebSocketLink(server.url, reconnect_attempts=3, backoff_s=0.05)
    sm = SplitModel(tiny, "2,2", cloud=link)
    stream = sm.stream(PROMPT, 40, stop_on_eos=False)
    ids = []
    for i, ev in enumerate(stream):
        ids += ev.token_ids
        if i == 10:  # a network fault: the socket dies under the client
            link._ws.socket.shutdown(socket.SHUT_RDWR)
        if i == 20:
            break
    assert ids == reference.token_ids[:21]
    assert sm.remote.recoveries == 1
    assert wait_for(lambda: server_stats(server.url)["sessions"] == 1)  # the dropped connection's session is gone
    server.stop(signal.SIGKILL)
    with pytest.raises(SplitInferError, match=r"cannot connect to the cloud at ws://127\.0\.0\.1:\d+ \(3 attempt"):
        next(stream)
