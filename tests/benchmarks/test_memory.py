"""Cloud-side memory measured on a real `splitinfer serve` process (tiny model)."""

from __future__ import annotations

import os
import sys

import pytest

from benchmarks.memory import proc_memory, server_memory
from splitinfer.client import SplitModel
from splitinfer.errors import SplitInferError
from splitinfer.models import load_model

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@linux_only
def test_proc_memory_of_this_process() -> None:
    m = proc_memory(os.getpid())
    assert 0 < m["rss_bytes"] <= m["peak_rss_bytes"]
    assert proc_memory(2**22 + 12345) == {}  # no such process


@pytest.mark.slow  # `make test-all` (not in CI: the 20-minute budget)
@linux_only
def test_server_memory_while_generating(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    loaded = load_model("tiny-random")
    outputs = []

    def drive(url: str) -> None:
        outputs.append(SplitModel(loaded, "2,2", cloud=url, wire_dtype="fp32").generate("hello", 8).token_ids)

    m = server_memory("tiny-random", "2,2", drive, timeout_s=120)
    assert len(outputs[0]) == 8  # the generation really went through the server
    assert 0 < m["loaded_rss_bytes"] <= m["peak_rss_bytes"]


def test_server_that_cannot_start_is_named(tiny_dir) -> None:
    with pytest.raises(SplitInferError, match="body server exited with code 2: .*bad split 5,5"):
        server_memory(str(tiny_dir), "5,5", lambda url: None, timeout_s=60)  # 6 layers: no body left
