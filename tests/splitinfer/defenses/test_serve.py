"""`splitinfer serve --defense`: the WebSocket cloud runs its side of quant and refuses a client without it."""

import pytest

from splitinfer.client import SplitModel
from splitinfer.errors import SplitInferError
from splitinfer.models import load_model
from tests.splitinfer.ws_helpers import ServerProcess

SPEC = "quant(format=int4,group=16)"


def test_served_quant_matches_in_process_and_refuses_a_mismatch(tiny_dir, tmp_path):
    server = ServerProcess(tiny_dir, "--defense", "quant", "--defense-option", "format=int4",
                           "--defense-option", "group=16", split="2,1", log_dir=tmp_path).wait_ready()
    try:
        loaded = load_model(str(tiny_dir))
        remote = SplitModel(loaded, "2,1", cloud=server.url, defense=SPEC).generate("hello there", 6)
        local = SplitModel(loaded, "2,1", defense=SPEC).generate("hello there", 6)
        assert remote.token_ids == local.token_ids and remote.bytes_sent == local.bytes_sent
        with pytest.raises(SplitInferError, match="defense mismatch: the client runs 'none'"):
            SplitModel(loaded, "2,1", cloud=server.url)
    finally:
        server.stop()


def test_serve_refuses_permute_before_loading_the_body(capsys):
    from splitinfer.cli import main

    rc = main(["serve", "--model", "no-such-model", "--split", "2,1", "--insecure", "--defense", "permute"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "cannot ship them yet" in err[0], err
