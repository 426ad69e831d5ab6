"""Hostile clients against one real ``splitinfer serve`` process with small limits (issue 16 items 1-5).

One shared server: a token, 1 MiB frames, 64 positions per session, 16
logged-in connections, a pending pool of 4, a quota of 3 sessions per
connection, sessions expiring after 2 s and connections after 4 s without real
work, and messages that must arrive within 2 s of their first byte.
"""

from __future__ import annotations

import random
import socket
import struct
import time

import pytest
import torch
from websockets.exceptions import ConnectionClosed

from splitinfer.client import SplitModel
from splitinfer.protocol import encode_frame
from splitinfer.server_config import ServerConfig
from splitinfer.ws_link import WebSocketLink
from tests.splitinfer.ws_helpers import (
    RawClient,
    ServerProcess,
    hello_frame,
    socket_closed_within,
    ws_binary_frame,
    ws_handshake,
)

D = 64
MAX_CONTEXT = 64
QUOTA = 3
PENDING = 4
TOKEN = "a-test-token-of-24-chars"
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    (tmp / "token").write_text(TOKEN)
    proc = ServerProcess(
        tiny_dir, "--token-file", str(tmp / "token"), "--max-frame-mb", "1", "--max-connections", "16",
        "--max-pending", str(PENDING), "--max-context", str(MAX_CONTEXT), "--max-sessions", "32",
        "--max-sessions-per-connection", str(QUOTA), "--hello-timeout-s", "3", "--idle-timeout-s", "2",
        "--connection-idle-s", "4", "--message-timeout-s", "2", log_dir=tmp,
    ).wait_ready()
    yield proc
    proc.stop()


def _client(server) -> RawClient:
    return RawClient(server.url, token=TOKEN)


def _forward(sid, start, n, **fields):
    return encode_frame("forward", {"session": sid, "positions": list(range(start, start + n)), **fields},
                        {"hidden": torch.randn(1, n, D).half()})


def _cache_len(c: RawClient, sid: str, known: int) -> int:
    """Cache length: cropping to ``known`` succeeds only if the cache holds at least that many entries."""
    reply = c.request(encode_frame("commit", {"session": sid, "crop": known}))
    assert reply.op == "committed", reply.fields
    return reply.fields["length"]


# ---------------------------------------------------------------- 1. the context limit cannot be bypassed
def test_keep_with_repeated_indices_cannot_grow_the_cache(server):
    c = _client(server)
    sid = c.open()
    assert c.request(_forward(sid, 0, 4)).op == "result"
    for _ in range(8):  # the attack from the issue: each commit used to add 30000 entries
        reply = c.request(encode_frame("commit", {"session": sid, "keep": {"prefix": 3, "accepted": [0] * 30000}}))
        assert reply.op == "error" and "strictly increasing" in reply.fields["message"], reply.fields
        assert len(reply.fields["message"]) < 400  # the 30000-entry list is not echoed back whole
    assert _cache_len(c, sid, 4) == 4
    c.close()


def test_negative_prefix_is_a_named_error(server):
    c = _client(server)
    sid = c.open()
    assert c.request(_forward(sid, 0, 4)).op == "result"
    reply = c.request(encode_frame("commit", {"session": sid, "keep": {"prefix": -3, "accepted": [0]}}))
    assert reply.op == "error" and "keep prefix -3 is outside the cache of 4 entries" in reply.fields["message"]
    assert "internal" not in reply.fields["message"]
    c.close()


def test_refused_forward_leaves_the_cache_unchanged(server):
    c = _client(server)
    sid = c.open()
    assert c.request(_forward(sid, 0, 4)).op == "result"
    over = c.request(_forward(sid, 3, MAX_CONTEXT, keep={"prefix": 2, "accepted": [0]}))  # keep first, then refuse
    assert over.op == "error" and "--max-context" in over.fields["message"], over.fields
    assert _cache_len(c, sid, 4) == 4  # the keep of the refused forward did not happen
    bad_keep = c.request(_forward(sid, 4, 1, keep={"prefix": 0, "accepted": [3, 3, 3, 3, 3]}))
    assert bad_keep.op == "error" and "strictly increasing" in bad_keep.fields["message"]
    assert _cache_len(c, sid, 4) == 4
    c.close()


def test_no_frame_sequence_grows_a_session_beyond_max_context(server):
    """Random forwards (chains and trees, with and without keep) and commits: never more than --max-context."""
    rng = random.Random(0)
    c = _client(server)
    sid = c.open()
    length = 0
    for _ in range(120):
        kind = rng.random()
        if kind < 0.5:
            n = rng.choice([1, 2, 5, 17, 40])
            fields = {}
            base = length
            if rng.random() < 0.5 and length:
                prefix = rng.randrange(-1, length + 2)
                accepted = [rng.randrange(-1, max(1, length - prefix) + 1) for _ in range(rng.randrange(0, 4))]
                fields["keep"] = {"prefix": prefix, "accepted": accepted}
                ok = 0 <= prefix <= length and all(0 <= a < length - prefix for a in accepted) and all(
                    x < y for x, y in zip(accepted, accepted[1:]))
                base = prefix + len(accepted) if ok else -1
            reply = c.request(_forward(sid, max(base, 0), n, **fields))
            if reply.op == "result":
                length = reply.fields["length"]
                assert base >= 0 and length == base + n
        else:
            prefix = rng.randrange(-2, length + 3)
            accepted = sorted(rng.sample(range(-1, 400), rng.randrange(0, 6)))
            if rng.random() < 0.3:
                accepted = accepted * 3
            reply = c.request(encode_frame("commit", {"session": sid, "keep": {"prefix": prefix,
                                                                               "accepted": accepted}}))
            if reply.op == "committed":
                length = reply.fields["length"]
        assert reply.op in ("result", "committed", "error")
        if reply.op == "error":
            assert "internal" not in reply.fields["message"], reply.fields
        assert length <= MAX_CONTEXT
        if length == 0 or rng.random() < 0.05:
            length = _cache_len(c, sid, 0)  # start over
    stats = c.stats()
    per_pos = 2 * 2 * 2 * (D // 4) * 4  # K and V, 2 body layers, 2 KV heads x 16 dims, fp32
    assert stats["kv_bytes"] <= MAX_CONTEXT * per_pos
    c.close()


# ---------------------------------------------------------------- 2. no lock-out before login
def test_authenticated_client_gets_in_with_the_pending_pool_full(tiny, server):
    silent = [ws_handshake("127.0.0.1", server.port) for _ in range(PENDING + 16)]  # > pending pool and > 16 slots
    oversized = []
    for _ in range(3):  # unauthenticated and sending a 200 KiB frame: cut off at its header
        s = ws_handshake("127.0.0.1", server.port)
        s.sendall(ws_binary_frame(b"\0" * (200 * 1024))[:4096])
        oversized.append(s)
    try:
        assert all(socket_closed_within(s, 5) is not None for s in oversized)
        ref = SplitModel(tiny, "2,2").generate(PROMPT, 8, stop_on_eos=False).token_ids
        sm = SplitModel(tiny, "2,2", cloud=WebSocketLink(server.url, token=TOKEN))
        assert sm.generate(PROMPT, 8, stop_on_eos=False).token_ids == ref
        sm.close()
        # the silent ones were dropped: the oldest to make room, the rest at the hello deadline
        assert sum(socket_closed_within(s, 6) is not None for s in silent) == len(silent)
    finally:
        for s in silent + oversized:
            s.close()


def test_hello_larger_than_the_pre_login_limit_is_cut_off(server):
    s = ws_handshake("127.0.0.1", server.port)
    s.sendall(ws_binary_frame(hello_frame(TOKEN, padding="x" * (128 * 1024))))
    assert socket_closed_within(s, 5) is not None
    s.close()


# ---------------------------------------------------------------- 3. quotas after login
def test_one_connection_cannot_take_more_than_its_quota(server):
    a, b = _client(server), _client(server)
    for _ in range(QUOTA):
        a.open()
    refused = a.request(encode_frame("open"))
    assert refused.op == "error" and "quota of 3 open sessions" in refused.fields["message"]
    assert b.open()  # others still can
    a.close()
    b.close()


def test_empty_commits_do_not_keep_a_session_alive(server):
    c = _client(server)
    sid = c.open()
    assert c.request(_forward(sid, 0, 2)).op == "result"
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3.0:  # idle timeout 2 s
        c.request(encode_frame("commit", {"session": sid, "keep": {"prefix": 2, "accepted": []}}))
        time.sleep(0.3)
    late = c.request(_forward(sid, 2, 1))
    assert late.op == "error" and "expired session" in late.fields["message"], late.fields
    c.close()


def test_idle_logged_in_connection_is_dropped(tiny, server):
    c = _client(server)
    t0 = time.monotonic()
    with pytest.raises(ConnectionClosed) as e:
        c.ws.recv(timeout=12)
    assert 3.5 < time.monotonic() - t0 < 10
    assert e.value.rcvd.code == 1001 and "idle" in e.value.rcvd.reason
    # a real client idle that long reconnects and replays its session transparently
    ref = SplitModel(tiny, "2,2").generate(PROMPT + " again", 6, stop_on_eos=False).token_ids
    sm = SplitModel(tiny, "2,2", cloud=WebSocketLink(server.url, token=TOKEN))
    stream = sm.stream(PROMPT + " again", 6, stop_on_eos=False)
    got = next(stream).token_ids
    time.sleep(5)  # connection idle limit: 4 s
    got += [t for ev in stream for t in ev.token_ids]
    assert got == ref and sm.remote.recoveries == 1
    sm.close()


def _fragment(payload: bytes, first: bool, fin: bool) -> bytes:
    opcode = 0x2 if first else 0x0
    head = struct.pack("!BB", (0x80 if fin else 0) | opcode, 0x80 | len(payload))
    mask = b"\x01\x02\x03\x04"
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def test_message_trickled_in_fragments_is_dropped(server):
    s = ws_handshake("127.0.0.1", server.port)
    s.sendall(ws_binary_frame(hello_frame(TOKEN)))
    s.settimeout(5)
    assert b"welcome" in s.recv(65536)
    s.sendall(_fragment(b"SPLI", first=True, fin=False))
    t0 = time.monotonic()
    closed = False
    while time.monotonic() - t0 < 10:  # one byte every 0.3 s: each fragment arrives whole, the message never
        try:
            s.sendall(_fragment(b"\0", first=False, fin=False))
        except OSError:
            closed = True
            break
        if socket_closed_within(s, 0.3) is not None:
            closed = True
            break
    assert closed and time.monotonic() - t0 < 6
    s.close()


# ---------------------------------------------------------------- 4./5. echoes, stats scope, exposure
def test_error_replies_do_not_echo_untrusted_input_whole(server):
    c = _client(server)
    reply = c.request(encode_frame("forward", {"session": "s" * 10_000, "positions": [0]},
                                   {"hidden": torch.zeros(1, 1, D).half()}))
    assert reply.op == "error" and "unknown, closed or expired session" in reply.fields["message"]
    assert len(reply.fields["message"]) < 300
    c.close()


def test_stats_show_only_the_callers_sessions(server):
    a, b = _client(server), _client(server)
    a.open()
    a.open()
    sa, sb = a.stats(), b.stats()
    assert sa["sessions"] == 2 and sb["sessions"] == 0 and sb["scope"] == "connection"
    for key in ("connections", "rss_bytes", "tokens", "requests"):
        assert key not in sb
    assert "/" not in sb["model"]  # the local model directory is not revealed
    a.close()
    b.close()


def test_plain_text_non_loopback_bind_with_a_token_warns():
    plain = ServerConfig(host="0.0.0.0", token=TOKEN)
    assert any("clear text" in w for w in plain.warnings())
    assert not any("clear text" in w for w in ServerConfig(host="127.0.0.1", token=TOKEN).warnings())
    tls = ServerConfig(host="0.0.0.0", token=TOKEN, tls_cert="c.pem", tls_key="k.pem")
    assert not any("clear text" in w for w in tls.warnings())


def test_server_still_serves_after_all_of_it(tiny, server):
    assert server.alive()
    sm = SplitModel(tiny, "2,2", cloud=WebSocketLink(server.url, token=TOKEN))
    assert len(sm.generate(PROMPT, 4, stop_on_eos=False).token_ids) == 4
    sm.close()
    with socket.create_connection(("127.0.0.1", server.port)):
        pass
