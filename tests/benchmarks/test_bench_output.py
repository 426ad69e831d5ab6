"""The single benchmarks write versioned results documents that ``bench regress`` reads (tiny model; figures
that depend on the shared machine are not checked)."""

from __future__ import annotations

import json

import pytest

from benchmarks import schema
from splitinfer.cli import main


def _regress_against_itself(path, capsys) -> None:
    capsys.readouterr()
    assert main(["bench", "regress", "--baseline", str(path), "--results", str(path)]) == 0
    assert "0 regressions" in capsys.readouterr().out


def test_bench_speed_document(tmp_path, capsys):
    out = tmp_path / "speed.json"
    assert main(["bench", "speed", "--model", "tiny-random", "--rtt-ms", "0,5", "--max-new-tokens", "4",
                 "--no-server-memory", "--out", str(out)]) == 0
    doc = schema.load(out)
    assert doc["suite"] == "bench-speed" and doc["config"]["split"] == "2,2"
    assert set(doc["results"]) == {"speed/split=2,2/rtt=0", "speed/split=2,2/rtt=5"}
    run = doc["results"]["speed/split=2,2/rtt=5"]
    assert run["efficiency"]["kind"] == "efficiency" and run["bytes_per_step"]["kind"] == "exact"
    eff = run["efficiency"]  # its measured spread travels with it: regress's tolerance when wider than 15%
    assert eff["ci_low"] <= eff["value"] <= eff["ci_high"]
    assert [r["rtt_ms"] for r in doc["data"]["rows"]] == [0.0, 5.0]  # the raw output, as before, under data
    _regress_against_itself(out, capsys)


def test_bench_exactness_document_and_deprecated_flags(tmp_path, capsys):
    out = tmp_path / "exact.json"
    assert main(["bench", "exactness", "--model", "tiny-random", "--splits", "2,2;1,3", "--prompts", "1",
                 "--tokens", "4", "--wire", "fp32", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "--tokens is deprecated; use --max-new-tokens" in err and "--wire is deprecated; use --wire-dtype" in err
    doc = schema.load(out)
    assert doc["config"]["max_new_tokens"] == 4 and doc["config"]["wire_dtype"] == ["fp32"]
    for split in ("2,2", "1,3"):
        assert doc["results"][f"exactness/split={split}/wire=fp32"]["identical_share"]["value"] == 1.0
    _regress_against_itself(out, capsys)


def test_bench_extract_document(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path))
    docs = tmp_path / "docs.jsonl"
    docs.write_text("\n".join(json.dumps({"text": f"Document {i}. " + "words " * 60}) for i in range(3)))
    out = tmp_path / "extract.json"
    assert main(["bench", "extract", "--model", "tiny-random", "--depths", "1,2", "--corpus", f"file:{docs}",
                 "--max-tokens", "200", "--max-length", "64", "--repeats", "1", "--out", str(out)]) == 0
    doc = schema.load(out)
    assert set(doc["results"]) == {"extract/boundary=head:1", "extract/boundary=head:2"}
    assert doc["results"]["extract/boundary=head:1"]["ratio"]["kind"] == "efficiency"
    _regress_against_itself(out, capsys)


@pytest.mark.slow  # `make test-all` (not in CI: the 20-minute budget)
def test_bench_transport_document(tmp_path, capsys):
    """A real `splitinfer serve` process: WebSocket vs in-process per-step cost, one concurrent session."""
    out = tmp_path / "transport.json"
    assert main(["bench", "transport", "--model", "tiny-random", "--max-new-tokens", "4", "--repeats", "1",
                 "--sessions", "1,2", "--synthetic-hidden", "", "--out", str(out)]) == 0
    doc = schema.load(out)
    assert doc["suite"] == "bench-transport"
    assert doc["results"]["transport/sessions=2"]["identical_outputs"]["value"] is True
    assert doc["results"]["transport/body=tiny-random"]["bytes_per_step"]["value"] > 0
    _regress_against_itself(out, capsys)


def test_bad_list_flags_of_single_benchmarks_are_one_line(capsys):
    for argv in (["bench", "transport", "--sessions", "1,two"], ["bench", "extract", "--depths", "1;2"],
                 ["bench", "exactness", "--wire-dtype", "fp8"]):
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "error: argument" in err[0], argv


def test_bench_decoding_document(tmp_path, capsys):
    out = tmp_path / "dec"
    assert main(["bench", "decoding", "--model", "tiny-random", "--max-new-tokens", "6", "--prompts-per-category",
                 "1", "--proposers", "sequential,prompt-lookup", "--no-ablation", "--out", str(out)]) == 0
    doc = schema.load(out / "results.json")
    assert doc["suite"] == "bench-decoding"
    assert {"decoding/sequential", "decoding/prompt-lookup"} <= set(doc["results"])
    assert doc["results"]["decoding/prompt-lookup"]["identical_share"]["value"] == 1.0
    _regress_against_itself(out / "results.json", capsys)


def test_bench_decoding_takes_feature_draft_options_in_the_one_option_form(capsys):
    from benchmarks.decoding_cli import feature_draft_options
    from splitinfer.cli import build_parser
    from splitinfer.errors import SplitInferError

    args = build_parser().parse_args(["bench", "decoding", "--feature-draft-option", "shortlist=false",
                                      "--decoding-option", "feature-draft.draft-head=/x"])
    assert "--feature-draft-option is deprecated" in capsys.readouterr().err
    assert feature_draft_options(args.decoding_option) == {"shortlist": False, "draft_head": "/x"}
    with pytest.raises(SplitInferError, match="takes only feature-draft options .* got alpha"):
        feature_draft_options(["alpha=2"])


def test_emit_builds_and_writes_the_document_only_with_out(tmp_path, capsys):
    from benchmarks.bench_output import emit

    def fail() -> dict:
        raise AssertionError("no document without --out")

    assert emit("the table", fail, None) == 0
    assert capsys.readouterr().out == "the table\n"
    doc = schema.new_results({"model": "tiny-random"}, "bench-test")
    assert emit("the table", lambda: doc, tmp_path / "r.json") == 0
    assert schema.load(tmp_path / "r.json")["suite"] == "bench-test"
