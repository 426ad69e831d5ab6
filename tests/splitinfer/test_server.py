"""``splitinfer serve`` as a real process: exact generation over wss:// with a token, handshake rules,
several sessions per connection, stats, the CLI commands, clean shutdown; one real-model test."""

from __future__ import annotations

import io
import json
import shutil
import signal
import ssl
import subprocess

import pytest
import torch
from websockets.exceptions import ConnectionClosed

from splitinfer.cli import main
from splitinfer.client import SplitModel
from splitinfer.errors import SplitInferError
from splitinfer.link import WanProfile
from splitinfer.protocol import encode_frame
from splitinfer.remote import CloudError
from splitinfer.ws_link import WebSocketLink
from tests.splitinfer.ws_helpers import RawClient, ServerProcess, server_stats, wait_for

TOKEN = "s3cret-token-for-tests-0123456789"
PROMPTS = ["Once upon a time", "def add(a, b):"]


def _self_signed(tmp):
    if shutil.which("openssl") is None:
        return None
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    return cert, key


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return _self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def server(tiny_dir, tls, tmp_path_factory):
    """Serves the tiny model with a token, over TLS when openssl is available."""
    tmp = tmp_path_factory.mktemp("srv")
    (tmp / "token").write_text(TOKEN + "\n")
    args = ["--token-file", str(tmp / "token")]
    if tls:
        args += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
    proc = ServerProcess(tiny_dir, *args, log_dir=tmp).wait_ready()
    yield proc
    proc.stop()


def _link(server, tls, **kw):
    return WebSocketLink(server.url, token=kw.pop("token", TOKEN), ca_file=str(tls[0]) if tls else None, **kw)


def _reference(tiny, prompt, n):
    return SplitModel(tiny, "2,2").generate(prompt, n, stop_on_eos=False).token_ids


def test_prints_url_and_uses_tls(server, tls):
    assert server.url.startswith("wss://127.0.0.1:" if tls else "ws://127.0.0.1:")


def test_generation_over_the_server_is_exact(tiny, server, tls):
    sm = SplitModel(tiny, "2,2", cloud=_link(server, tls))
    for prompt in PROMPTS:
        got = sm.generate(prompt, 24, stop_on_eos=False)
        assert got.token_ids == _reference(tiny, prompt, 24)
        assert got.bytes_sent > 0 and got.bytes_received > 0
    sm.close()


def test_wan_emulation_on_top_of_the_real_link(tiny, server, tls):
    link = _link(server, tls, wan=WanProfile(rtt_ms=25, bandwidth_mbps=100))
    sm = SplitModel(tiny, "2,2", cloud=link)
    assert sm.generate(PROMPTS[0], 4, stop_on_eos=False).token_ids == _reference(tiny, PROMPTS[0], 4)
    st = link.stats
    assert st.emulated_s >= 0.025 * st.round_trips and st.wall_s >= st.emulated_s
    sm.close()


def test_cloud_url_string_reads_token_and_ca_from_env(tiny, server, tls, monkeypatch):
    monkeypatch.setenv("SPLITINFER_TOKEN", TOKEN)
    if tls:
        monkeypatch.setenv("SSL_CERT_FILE", str(tls[0]))
    sm = SplitModel(tiny, "2,2", cloud=server.url)
    assert sm.generate(PROMPTS[0], 8, stop_on_eos=False).token_ids == _reference(tiny, PROMPTS[0], 8)
    sm.close()


def test_several_sessions_interleaved_on_one_connection(tiny, server, tls):
    link = _link(server, tls)
    a, b = SplitModel(tiny, "2,2", cloud=link), SplitModel(tiny, "2,2", cloud=link)
    sa = a.stream(PROMPTS[0], 16, stop_on_eos=False)
    sb = b.stream(PROMPTS[1], 16, stop_on_eos=False)
    got_a, got_b = [], []
    for ea, eb in zip(sa, sb):  # alternate steps of the two sessions over the same socket
        got_a += ea.token_ids
        got_b += eb.token_ids
    assert got_a == _reference(tiny, PROMPTS[0], 16) and got_b == _reference(tiny, PROMPTS[1], 16)
    link.close()


@pytest.mark.parametrize("token", ["wrong-token", ""])
def test_missing_or_wrong_token_is_refused(tiny, server, tls, token):
    with pytest.raises(CloudError, match="missing or wrong token"):
        SplitModel(tiny, "2,2", cloud=_link(server, tls, token=token or None))


def _raw(server, tls, **kwargs) -> RawClient:
    ctx = ssl.create_default_context(cafile=str(tls[0])) if tls else None
    return RawClient(server.url, ssl=ctx, **kwargs)


def _stats(server, tls) -> dict:
    c = _raw(server, tls, token=TOKEN)
    try:
        return c.stats()
    finally:
        c.close()


def test_first_frame_must_be_hello(server, tls):
    c = _raw(server, tls, hello=False)
    reply = c.request(encode_frame("open"))
    assert reply.op == "error" and "first frame must be 'hello'" in reply.fields["message"]
    with pytest.raises(ConnectionClosed) as e:  # and closed the connection
        c.request(encode_frame("stats"))
    assert e.value.rcvd.code == 1008


def test_body_mismatch_is_refused(tiny, server, tls):
    with pytest.raises(CloudError, match="body_sha256 mismatch.*same --model, --split"):
        SplitModel(tiny, "1,1", cloud=_link(server, tls))


def test_stats_show_body_only_and_sessions(tiny, server, tls):
    c = _raw(server, tls, token=TOKEN)
    c.open()
    s = c.stats()
    assert s["sessions"] == 1 and s["scope"] == "connection"  # own sessions only (no --stats-all)
    assert not s["has_embedding"] and not s["has_lm_head"]
    assert all(m.startswith("layers.") or m == "rotary_emb" for m in s["loaded_modules"])
    body_layers = tiny.model.model.layers[2 : tiny.num_layers - 2]
    assert s["param_count"] == sum(p.numel() for p in body_layers.parameters())
    c.close()
    assert wait_for(lambda: _stats(server, tls)["sessions"] == 0)  # closing the connection closed its session


def test_generate_and_chat_cli(tiny, tiny_dir, server, tls, tmp_path, capsys, monkeypatch):
    (tmp_path / "token").write_text(TOKEN)
    cloud = ["--cloud", server.url, "--token-file", str(tmp_path / "token")]
    cloud += ["--tls-ca", str(tls[0])] if tls else []
    assert main(["generate", "--model", str(tiny_dir), *cloud, "--max-new-tokens", "8", "--json", PROMPTS[0]]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["token_ids"] == SplitModel(tiny, "2,2").generate(PROMPTS[0], 8).token_ids

    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n/stats\nhow are you?\n/bogus\n/quit\n"))
    assert main(["chat", "--model", str(tiny_dir), *cloud, "--max-new-tokens", "6"]) == 0
    out = capsys.readouterr().out
    assert "last turn: " in out and "tok/s" in out and "steps" in out and "sent " in out
    assert "unknown command '/bogus'" in out


def test_serve_refuses_unsafe_or_impossible_setups(tiny_dir, capsys):
    assert main(["serve", "--model", str(tiny_dir), "--host", "0.0.0.0"]) == 2
    assert "without a token" in capsys.readouterr().err
    assert main(["serve", "--model", str(tiny_dir), "--tls-cert", "x.pem"]) == 2
    assert "--tls-key" in capsys.readouterr().err
    assert main(["serve", "--model", str(tiny_dir), "--max-batch", "0"]) == 2
    assert "--max-batch 0: must be >= 1" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["serve", "--model", str(tiny_dir), "--device", "cuda"]) == 2
        assert "CUDA is not available" in capsys.readouterr().err
        assert main(["serve", "--model", str(tiny_dir), "--device-map", "auto"]) == 2
        assert "needs CUDA GPUs" in capsys.readouterr().err
    with pytest.raises(SplitInferError, match="bad cloud URL"):
        WebSocketLink("http://127.0.0.1:1")
    for url in ("ws://127.0.0.1:99999", "ws://127.0.0.1:abc"):  # urlsplit raised ValueError on reading the port
        with pytest.raises(SplitInferError, match="the port must be a number 0-65535"):
            WebSocketLink(url)
    with pytest.raises(SplitInferError, match="--tls-ca /nonexistent.pem: no such file"):
        WebSocketLink("wss://127.0.0.1:1", ca_file="/nonexistent.pem")


def test_sigterm_shuts_down_cleanly(server):
    """Last in the file: stops the module's server."""
    assert server.alive()
    assert server.stop(signal.SIGTERM) == 0
    assert "server stopped" in server.stderr()


@pytest.mark.real_model
def test_real_model_over_the_server(real_model, tmp_path):
    proc = ServerProcess("default", log_dir=tmp_path).wait_ready(120)
    try:
        sm = SplitModel(real_model, "2,2", cloud=proc.url)
        prompt = "The capital of France is"
        got = sm.generate(prompt, 16, stop_on_eos=False)
        ref = SplitModel(real_model, "2,2").generate(prompt, 16, stop_on_eos=False)
        assert got.token_ids == ref.token_ids
        s = server_stats(proc.url)
        assert not s["has_embedding"] and not s["has_lm_head"]
        assert all(m.startswith("layers.") or m == "rotary_emb" for m in s["loaded_modules"])
        body = real_model.model.model.layers[2 : real_model.num_layers - 2]
        assert s["param_count"] == sum(p.numel() for p in body.parameters())
        assert s["param_count"] < sum(p.numel() for p in real_model.model.parameters()) - 49152 * 576
        sm.close()
    finally:
        proc.stop()


def test_request_threads_keep_to_one_intra_op_thread_and_the_main_thread_keeps_its_own():
    """serve's request threads must never start a second OpenMP pool (it slowed every step ~1.75x)."""
    import threading

    import torch

    from splitinfer.server import _single_intra_op_thread

    before = torch.get_num_threads()
    seen = []

    def worker():
        _single_intra_op_thread()
        torch.randn(4096, 576).half().float()  # a long prefill's cast: one intra-op thread
        seen.append(torch.get_num_threads())

    t = threading.Thread(target=worker)
    t.start()
    t.join(30)
    try:
        assert seen == [1] and torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)  # the default for threads started later in this test process
