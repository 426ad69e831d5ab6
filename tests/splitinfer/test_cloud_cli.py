"""``splitinfer chat`` with the body in-process, and the ``--cloud`` flags (the WebSocket side: test_server.py)."""

import io

import pytest

from splitinfer.cli import main
from splitinfer.cloud_cli import CloudFlags, format_turn_stats
from splitinfer.errors import SplitInferError


def test_cloud_flags_without_a_cloud_are_in_process_and_refuse_stray_options():
    assert CloudFlags().link() is None
    for flags in (CloudFlags(token_file="t"), CloudFlags(tls_ca="ca.pem")):
        with pytest.raises(SplitInferError, match="--token-file and --tls-ca need --cloud ws://HOST:PORT"):
            flags.link()
    assert format_turn_stats(None) == "no turn yet"


def test_in_process_chat_session(monkeypatch, capsys):
    script = "/stats\n\nhello\n/stats\n/reset\n/nope\nagain\n"  # ends at EOF, without /quit
    monkeypatch.setattr("sys.stdin", io.StringIO(script))
    assert main(["chat", "--model", "tiny-random", "--max-new-tokens", "4", "--rtt-ms", "1",
                 "--system", "be brief"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("no turn yet\n")
    assert "last turn: " in out and "tok/s" in out and "(conversation cleared)" in out
    assert "unknown command '/nope'; commands: /stats, /reset, /quit" in out
    assert "chat with tiny-random split 2,2 via in-process body" in err


def test_chat_flag_errors_are_one_line(capsys):
    assert main(["chat", "--model", "tiny-random", "--token-file", "t"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["splitinfer: error: --token-file and --tls-ca need --cloud ws://HOST:PORT"]
