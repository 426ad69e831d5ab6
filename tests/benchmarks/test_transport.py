"""benchmarks.transport directly: the synthetic bodies, the transport share, the tables, a server that fails to start
(the whole benchmark runs in test_bench_output.py)."""

from __future__ import annotations

import pytest

from benchmarks.transport import ServerProcess, _transport_ms, format_transport, synthetic_model_dir
from splitinfer.errors import SplitInferError
from splitinfer.models import load_model


def test_synthetic_bodies_have_the_asked_width_and_thin_layers(tmp_path):
    loaded = load_model(str(synthetic_model_dir(48, tmp_path)))
    cfg = loaded.model.config
    assert loaded.hidden_size == 48 and loaded.num_layers == 3
    assert cfg.intermediate_size == 16 and cfg.num_attention_heads * cfg.head_dim == 8  # compute stays negligible


ROW = {"model": "m", "hidden_size": 576, "bytes_per_step": 2400.0, "inproc_step_ms": 10.0, "ws_step_ms": 13.0,
       "overhead_ms": 3.0, "ws_codec_ms": 0.5, "inproc_codec_ms": 0.25, "ws_network_ms": 2.0,
       "inproc_network_ms": 0.5}


def test_transport_share_is_extra_network_plus_extra_codec():
    assert _transport_ms(ROW) == pytest.approx((2.0 - 0.5) + (0.5 - 0.25))


def test_tables_show_every_row():
    r = {"model": "m", "split": "2,2", "wire_dtype": "fp16", "n_tokens": 8, "repeats": 1, "client_threads": 1,
         "server_threads": 1, "cpus": 2, "overhead": [ROW],
         "concurrency": [{"sessions": 2, "aggregate_tok_s": 12.5, "per_session_tok_s": 6.25,
                          "identical_outputs": True}]}
    text = format_transport(r)
    assert "1.75" in text  # the transport share, computed for rows written before it was recorded
    assert text.splitlines()[-1].split() == ["2", "12.5", "6.2", "True"]


def test_a_server_that_does_not_start_is_one_error_with_the_command():
    with pytest.raises(SplitInferError, match="did not start .*run the command by hand: .* serve --model nope"):
        ServerProcess("nope", "2,2")
