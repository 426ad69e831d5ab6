import json

import pytest

from benchmarks.report import write_report
from benchmarks.schema import SchemaError, add_metric, metric, new_results


def fake_results():
    res = new_results({"model": "tiny-random", "model_sha256": "ab" * 32, "num_layers": 6, "hidden_size": 64,
                       "seed": 0}, "unit")
    add_metric(res, "speed/sequential/split=1,2/rtt=80", "tau", metric(1.0, kind="exact"))
    bd = {k: 1.0 for k in ("head_ms", "body_ms", "tail_ms", "codec_ms", "network_ms", "draft_ms", "other_ms")}
    speed = [{"head_layers": a, "tail_layers": 2, "decoding": d, "rtt_ms": 80.0, "bandwidth_mbps": 100.0,
              "tok_s_measured": 7.0 + a, "tok_s_modelled": 7.5 + a, "efficiency": 0.95, "tau": 1.0 if d ==
              "sequential" else 2.0, "tau_by_category": {"code": 1.5}, "bytes_per_step": 3000,
              "tokens_sent_per_step": 1, "breakdown_ms": {**bd, "total_ms": 7.0}, "tok_s_modelled_flat": 8.0}
             for a in (1, 2) for d in ("sequential", "combined")]
    m = {"value": 0.9, "ci_low": 0.85, "ci_high": 0.95, "n": 100, "higher_is_better": True, "kind": "accuracy"}
    attacks = {"rows": [{"attack": "vocab-match", "threat_model": "white-box", "side": "head", "depth": a,
                         "corpus": "all", "metrics": {"token_acc_top1": m}, "seconds_per_token": 0.01}
                        for a in (1, 2)],
               "baselines": {"uniform": 1e-4, "unigram prior": 0.05},
               "pii_rows": [{"attack": "vocab-match", "type": "email", "value": 1.0}]}
    res["data"] = {"speed": speed, "attacks": attacks}
    return res


def test_report_and_plots_are_written(tmp_path):
    res = fake_results()
    path = write_report(res, tmp_path)
    text = path.read_text()
    assert text.startswith("# splitinfer report")
    assert "| 1 | 90.0% (vocab-match) | 8.5 modelled, 8.0 measured (tau 1.00)" in text
    assert not (tmp_path / "tradeoff.png").exists() and "tradeoff" not in text  # the flat privacy-vs-speed plot went
    for png in ("recovery_head.png", "pii.png", "latency_breakdown.png", "tau.png"):
        assert (tmp_path / png).stat().st_size > 5000
        assert f"]({png})" in text
    json.dumps(res)  # the document stays serialisable


def test_a_run_without_attacks_or_speed_has_no_empty_summary_or_plots_section(tmp_path):
    res = fake_results()
    res["data"] = {"stage_seconds": {"defenses": 1.0}}  # e.g. a defenses-only shard
    text = write_report(res, tmp_path).read_text()
    assert "## Summary" not in text and "## Plots" not in text and "| local head layers |" not in text


def test_a_document_that_is_not_a_suite_run_is_refused_in_one_line(tmp_path):
    batching = new_results({"model": "default", "max_batch": 8}, "bench-batching")  # a benchmark's own document
    with pytest.raises(SchemaError, match="'bench-batching' results document is not a suite run's .*model_sha256"):
        write_report(batching, tmp_path)
    damaged = fake_results()
    damaged["data"] = []
    with pytest.raises(SchemaError, match="data is a list, not a table of stages"):
        write_report(damaged, tmp_path)
    assert not (tmp_path / "report.md").exists()
