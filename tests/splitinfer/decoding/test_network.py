"""Tree verification over the real WebSocket server (``splitinfer serve``), not just the in-process link."""

import pytest
import torch

from splitinfer.client import SplitModel
from splitinfer.decoding.base import list_proposers
from splitinfer.ws_link import WebSocketLink
from tests.splitinfer.ws_helpers import ServerProcess

TOKEN = "decoding-test-token-0123456789abcdef"
OPTIONS = {"jacobi": {"block": 6}, "lookahead": {"window": 3, "ngram": 4, "pool": 3}}


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("srv")
    (tmp / "token").write_text(TOKEN + "\n")
    proc = ServerProcess(tiny_dir, "--token-file", str(tmp / "token"), log_dir=tmp).wait_ready()
    yield proc
    proc.stop()


def test_every_proposer_is_exact_over_the_network(tiny, server, feature_head_dir):
    local = SplitModel(tiny, "2,2", wire_dtype="fp32")
    remote = SplitModel(tiny, "2,2", cloud=WebSocketLink(server.url, token=TOKEN), wire_dtype="fp32")
    prompt = "the cat sat on the mat. the cat sat on the mat. the cat"
    ref = local.generate(prompt, 32, record_logits=True, stop_on_eos=False)
    for name in list_proposers():
        got = remote.generate(prompt, 32, record_logits=True, stop_on_eos=False, decoding=name,
                              decoding_options={**OPTIONS.get(name, {}), **({"draft_head": str(feature_head_dir)}
                                                                             if name == "feature-draft" else {})})
        assert got.token_ids == ref.token_ids, name
        assert (torch.stack(got.logits) - torch.stack(ref.logits)).abs().max() <= 1e-4, name
    remote.close()
