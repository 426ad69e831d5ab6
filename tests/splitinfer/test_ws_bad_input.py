"""Bad input against a live ``splitinfer serve`` process (issue 3 §4).

Each case sends raw bytes over a WebSocket and asserts that the error frame
names the problem, that the server stays up, and that another session that is
mid-generation on the same server still produces exactly the in-process
tokens at its next step. (Expired sessions: ``test_load.py``, which runs a
server with a short ``--idle-timeout-s``.)
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
import torch
from websockets.exceptions import ConnectionClosed

from splitinfer.client import SplitModel
from splitinfer.errors import SplitInferError
from splitinfer.protocol import DEFAULT_LIMITS, decode_frame, encode_frame
from splitinfer.remote import RemoteBody
from splitinfer.ws_link import WebSocketLink
from tests.splitinfer.ws_helpers import (
    RawClient,
    ServerProcess,
    hello_frame,
    raw_frame,
    server_stats,
    socket_closed_within,
    ws_binary_frame,
    ws_handshake,
)

D = 64  # hidden size of the tiny model
MAX_CONTEXT = 64
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    """1 MiB frames, 64-token context, short hello/handshake/keepalive timeouts (idle expiry: test_load)."""
    proc = ServerProcess(tiny_dir, "--stats-all", "--max-frame-mb", "1", "--max-context", str(MAX_CONTEXT),
                         "--hello-timeout-s", "1",
                         "--open-timeout-s", "1", "--ping-interval-s", "1", "--ping-timeout-s", "1",
                         "--close-timeout-s", "1", log_dir=tmp_path_factory.mktemp("logs")).wait_ready()
    yield proc
    proc.stop()


class Victim:
    """A session mid-generation on the main server; each step must match the in-process run."""

    def __init__(self, tiny, url):
        self.ref = SplitModel(tiny, "2,2").generate(PROMPT, 40, stop_on_eos=False).token_ids
        self.sm = SplitModel(tiny, "2,2", cloud=WebSocketLink(url))
        self._new()

    def _new(self):
        self.stream, self.i = self.sm.stream(PROMPT, len(self.ref), stop_on_eos=False), 0

    def step(self):
        ev = next(self.stream, None)
        if ev is None:
            self._new()
            ev = next(self.stream)
        assert ev.token_ids == [self.ref[self.i]], f"victim session diverged at token {self.i}"
        self.i += 1


@pytest.fixture(scope="module")
def victim(tiny, server):
    v = Victim(tiny, server.url)
    v.step()
    return v


@pytest.fixture
def client(server):
    c = RawClient(server.url)
    yield c
    c.close()


def _hidden(n=3, dtype=torch.float16, d=D):
    return torch.randn(1, n, d).to(dtype)


def _forward(sid, n=3, start=0, hidden=None, **fields):
    h = _hidden(n) if hidden is None else hidden
    fields = {"session": sid, "positions": list(range(start, start + n)), **fields}
    return encode_frame("forward", fields, {"hidden": h})


def _spec(shape, dtype="float16", name="hidden"):
    return {"name": name, "dtype": dtype, "shape": shape}


# Each case: a function of the session id giving the bytes to send, and what the error must say.
CASES = {
    "truncated prefix": (lambda sid: _forward(sid)[:5], "truncated frame"),
    "truncated header": (lambda sid: _forward(sid)[:14], "truncated frame: header claims"),
    "truncated payload": (lambda sid: _forward(sid)[:-10],
                          "payload is 374 bytes but the tensor shapes x dtypes need 384"),
    "wrong magic": (lambda sid: b"HTTP" + _forward(sid)[4:], "bad magic"),
    "unsupported version": (lambda sid: raw_frame({"op": "open"}, version=99), "unsupported protocol version 99"),
    "header not JSON": (lambda sid: raw_frame(b"{op: forward"), "not valid UTF-8 JSON"),
    "header not UTF-8": (lambda sid: raw_frame(b"\xff\xfe\xfd"), "not valid UTF-8 JSON"),
    "header not an object": (lambda sid: raw_frame(b"[1, 2]"), "must be a JSON object"),
    "header without op": (lambda sid: raw_frame({"session": sid}), "unknown op None"),
    "unknown op": (lambda sid: raw_frame({"op": "exec"}), "unknown op 'exec'"),
    "reply op sent as request": (lambda sid: encode_frame("welcome", {"protocol": 1}), "not a request"),
    "lacks positions": (lambda sid: raw_frame({"op": "forward", "session": sid, "tensors": []}),
                        "lacks the field 'positions'"),
    "lacks session": (lambda sid: raw_frame({"op": "close"}), "lacks the field 'session'"),
    "field of wrong type": (lambda sid: raw_frame({"op": "forward", "session": 7, "positions": [0]}),
                            "field 'session' of a 'forward' frame must be str"),
    "positions not integers": (lambda sid: raw_frame({"op": "forward", "session": sid, "positions": ["a"]}),
                               "field 'positions' must hold integers"),
    "no hidden tensor": (lambda sid: raw_frame({"op": "forward", "session": sid, "positions": [0]}),
                         "carries no 'hidden' tensor"),
    "shape x dtype != bytes": (lambda sid: raw_frame({"op": "forward", "session": sid, "positions": [0, 1, 2],
                                                      "tensors": [_spec([1, 3, D])]}, b"\0" * 100),
                               "payload is 100 bytes but the tensor shapes x dtypes need 384"),
    "claimed shape beyond limit": (lambda sid: raw_frame({"op": "forward", "session": sid, "positions": [0],
                                                          "tensors": [_spec([1, 10**8, D], "float32")]}),
                                   "over the frame limit"),
    "claimed header length beyond limit": (lambda sid: raw_frame({"op": "open"}, hlen=2**31),
                                           "header of 2147483648 bytes exceeds the limit"),
    "too many dims": (lambda sid: raw_frame({"op": "open", "tensors": [_spec([1, 1, 1, 1, 1])]}), "bad shape"),
    "negative dim": (lambda sid: raw_frame({"op": "open", "tensors": [_spec([-1])]}), "bad shape"),
    "too many tensors": (lambda sid: raw_frame({"op": "open", "tensors": [_spec([0], name=f"t{i}") for i in range(5)]}),
                         "at most 4 entries"),
    "duplicate tensor names": (lambda sid: raw_frame({"op": "open", "tensors": [_spec([0]), _spec([0])]}),
                               "duplicate tensor names"),
    "unsupported dtype": (lambda sid: raw_frame({"op": "open", "tensors": [_spec([1], "object")]}),
                          "unsupported dtype 'object'"),
    "positions list beyond limit": (lambda sid: raw_frame({"op": "forward", "session": sid,
                                                           "positions": list(range(70000))}), "exceeds the limit"),
    "hidden of wrong width": (lambda sid: _forward(sid, hidden=_hidden(3, d=D // 2)), "expected [1, 3, 64]"),
    "hidden rows != positions": (lambda sid: _forward(sid, n=2, hidden=_hidden(3)), "expected [1, 2, 64]"),
    "integer hidden": (lambda sid: _forward(sid, hidden=torch.ones(1, 3, D, dtype=torch.int64)),
                       "must be a floating tensor"),
    "NaN values": (lambda sid: _forward(sid, hidden=_hidden().index_fill_(2, torch.tensor([5]), float("nan"))),
                   "NaN or Inf"),
    "Inf values": (lambda sid: _forward(sid, hidden=_hidden().index_fill_(1, torch.tensor([1]), float("inf"))),
                   "NaN or Inf"),
    "unknown session": (lambda sid: _forward("0123456789abcdef"), "unknown, closed or expired session"),
    "positions that skip": (lambda sid: _forward(sid, start=2), "do not continue the session's 0 cached positions"),
    "bad parent array": (lambda sid: _forward(sid, parents=[0, 0, 1]), "parent array entry 0 is 0"),
    "malformed keep": (lambda sid: _forward(sid, keep="all"), "'keep' must be"),
    "crop beyond cache": (lambda sid: encode_frame("commit", {"session": sid, "crop": 999}), "cannot crop"),
    "context beyond --max-context": (lambda sid: _forward(sid, n=MAX_CONTEXT + 1),
                                     "exceeds the server's --max-context 64"),
    "oversize frame (codec limit)": (lambda sid: raw_frame({"op": "open"}, b"\0" * (3 * 2**19)),
                                     "exceeds the limit of 1048576 bytes"),
    "text message": (lambda sid: "hello", "text message"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_frame_gets_a_named_error(case, client, victim, server):
    make, expected = CASES[case]
    sid = client.open()
    reply = client.request(make(sid))
    assert reply.op == "error", reply
    assert expected in reply.fields["message"], reply.fields["message"]
    assert client.stats()["sessions"] >= 1  # the connection still works
    victim.step()


def test_oversize_limits_are_checked_before_allocating(client, victim, server):
    before = client.stats()["rss_bytes"]
    sid = client.open()
    for n in (10**6, 10**8, 2**30):  # claims of 256 MB .. 256 GB, sent as a few hundred bytes
        frame = raw_frame({"op": "forward", "session": sid, "positions": [0], "tensors": [_spec([1, n, D], "float32")]})
        assert "over the frame limit" in client.request(frame).fields["message"]
    assert client.stats()["rss_bytes"] - before < 32 * 2**20
    victim.step()


def test_closed_session_and_positions_going_backwards(client, victim):
    sid = client.open()
    assert client.request(_forward(sid, n=4)).op == "result"
    back = client.request(_forward(sid, n=1, start=1))
    assert "do not continue the session's 4 cached positions; expected [4]" in back.fields["message"]
    skip = client.request(_forward(sid, n=1, start=9))
    assert "do not continue" in skip.fields["message"]
    assert client.request(encode_frame("close", {"session": sid})).op == "closed"
    again = client.request(_forward(sid, n=1, start=4))
    assert "unknown, closed or expired session" in again.fields["message"]
    victim.step()


def test_context_limit_counts_cached_positions(client, victim):
    sid = client.open()
    assert client.request(_forward(sid, n=MAX_CONTEXT - 1)).op == "result"
    over = client.request(_forward(sid, n=2, start=MAX_CONTEXT - 1))
    assert "context of 65 tokens exceeds the server's --max-context 64" in over.fields["message"]
    victim.step()


def test_sessions_of_other_connections_are_invisible(server, victim):
    a, b = RawClient(server.url), RawClient(server.url)
    sid = a.open()
    reply = b.request(_forward(sid, n=1))
    assert "unknown, closed or expired session" in reply.fields["message"]
    assert a.request(_forward(sid, n=1)).op == "result"
    a.close()
    b.close()
    victim.step()


def test_frame_beyond_websocket_max_size_closes_the_connection(client, victim, server):
    client.ws.send(b"\0" * (3 * 2**20))  # over max_size (limit + 1 MiB): websockets refuses to buffer it
    with pytest.raises(ConnectionClosed) as e:
        client.ws.recv(timeout=10)
    assert e.value.rcvd is not None and e.value.rcvd.code == 1009
    assert server_stats(server.url)["connections"] >= 1  # still up
    victim.step()


# ---------------------------------------------------------------- silent and stalled clients
def test_client_that_sends_nothing_after_connecting(server, victim):
    c = RawClient(server.url, hello=False)
    t0 = time.monotonic()
    assert "no hello frame within 1 s" in decode_frame(c.ws.recv(timeout=10)).fields["message"]
    with pytest.raises(ConnectionClosed):
        c.ws.recv(timeout=10)
    assert time.monotonic() - t0 < 5
    victim.step()


def test_tcp_client_that_never_handshakes(server, victim):
    s = socket.create_connection(("127.0.0.1", server.port))
    assert socket_closed_within(s, 10) is not None  # open timeout: 1 s
    s.close()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # half a handshake, then silence
    assert socket_closed_within(s, 10) is not None
    s.close()
    victim.step()


@pytest.mark.parametrize("after_hello", [False, True])
def test_client_that_sends_half_a_frame_and_stalls(server, victim, after_hello):
    s = ws_handshake("127.0.0.1", server.port)
    if after_hello:
        s.sendall(ws_binary_frame(hello_frame()))
        s.settimeout(5)
        assert b"welcome" in s.recv(65536)
    frame = ws_binary_frame(_forward("0123456789abcdef", n=8))
    s.sendall(frame[: len(frame) // 2])  # the WebSocket frame header promises more bytes than ever come
    closed = socket_closed_within(s, 15)  # hello timeout, or keepalive: ping unanswered for 1 s, then close
    assert closed is not None, "the server kept a stalled client"
    s.close()
    victim.step()


# ---------------------------------------------------------------- the client validates what a server sends back
ROGUE_REPLIES = {
    "NaN hidden states": (lambda f: encode_frame("result", {"session": "s1"}, {
        "hidden": torch.full_like(f.tensors["hidden"], float("nan"))}), "NaN or Inf"),
    "wrong shape": (lambda f: encode_frame("result", {"session": "s1"}, {"hidden": f.tensors["hidden"][:, :1]}),
                    "shape [1, 1, 64]; expected [1, 3, 64]"),
    "wrong dtype": (lambda f: encode_frame("result", {"session": "s1"}, {"hidden": f.tensors["hidden"].float()}),
                    "dtype torch.float32; expected torch.float16"),
    "another session": (lambda f: encode_frame("result", {"session": "s2"}, {"hidden": f.tensors["hidden"]}),
                        "expected a 'result' for session s1"),
    "garbage bytes": (lambda f: b"\x00garbage", "invalid frame in reply to 'forward': truncated frame"),
    "text message": (lambda f: "not a frame", "text message"),
    "bad timing field": (lambda f: encode_frame("result", {"session": "s1", "server_ms": {"body": "x"}},
                                                {"hidden": f.tensors["hidden"]}), "malformed 'server_ms'"),
    "oversize reply": (lambda f: b"\0" * (DEFAULT_LIMITS.max_frame_bytes + 2 * 2**20), "closed (1009)"),
}


@pytest.fixture(scope="module")
def rogue():
    """A fake cloud that answers hello/open properly and every forward with the reply under test."""
    from websockets.sync.server import serve

    state = {"reply": None}

    def handler(ws):
        for msg in ws:
            f = decode_frame(msg)
            if f.op == "hello":
                ws.send(encode_frame("welcome", {"protocol": 1}))
            elif f.op == "open":
                ws.send(encode_frame("opened", {"session": "s1"}))
            elif f.op == "forward":
                ws.send(state["reply"](f))
            else:
                ws.send(encode_frame("closed", {"session": "s1"}))

    srv = serve(handler, "127.0.0.1", 0, compression=None, max_size=None)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    state["url"] = f"ws://127.0.0.1:{srv.socket.getsockname()[1]}"
    yield state
    srv.shutdown()


@pytest.mark.parametrize("case", list(ROGUE_REPLIES))
def test_client_refuses_bad_replies(rogue, case):
    make, expected = ROGUE_REPLIES[case]
    rogue["reply"] = make
    remote = RemoteBody(WebSocketLink(rogue["url"], reconnect_attempts=1))
    remote.hello()
    remote.open()
    with pytest.raises(SplitInferError) as e:
        remote.forward(_hidden(3), [0, 1, 2])
    assert expected in str(e.value)
    remote.link.close()
