"""The speed stages called directly on the tiny model (the ci suite runs them end to end), and the speed
stage's measured spread of the efficiency metric (what regress widens its tolerance to)."""

from benchmarks.schema import new_results
from benchmarks.stage_speed import _spread, stage_exactness, stage_rtt_model, stage_speed
from splitinfer import timing
from tests.splitinfer.test_timing_rtt import synthetic_steps

COMBINED = {"combined": {"step_ms": 60.0, "token_ms": 1.0}}  # fixed cost model: reproducible tau


def test_stage_speed_rows_and_metrics(tiny):
    results = new_results({}, "t")
    cfg = {"head_depths": [1, 2], "tail_layers": 2, "decodings": ["sequential", "combined"], "rtt_ms": [5, 20],
           "bandwidth_mbps": 100, "prompts_per_category": 1, "categories": ["code"], "tokens": 8,
           "decoding_options": COMBINED}
    rows = stage_speed(tiny, cfg, results)
    assert [(r["head_layers"], r["decoding"], r["rtt_ms"]) for r in rows] == [
        (a, d, r) for a in (1, 2) for d in ("sequential", "combined") for r in (5.0, 20.0)]
    for r in rows:
        assert r["tok_s_measured"] > 0 and r["efficiency"] > 0 and set(r["tau_by_category"]) == {"code"}
        assert r["tau"] == 1.0 if r["decoding"] == "sequential" else r["tau"] >= 1.0
        assert r["breakdown_ms"]["network_ms"] >= r["rtt_ms"] * 0.9  # the emulated link's round trip is in it
    run = results["results"]["speed/sequential/split=1,2/rtt=20"]
    assert run["tau"]["kind"] == "exact" and run["efficiency"]["kind"] == "efficiency"
    assert stage_speed(tiny, cfg, new_results({}, "t"))[0]["tau"] == rows[0]["tau"]  # greedy tau is reproducible


def test_stage_exactness_and_rtt_model(tiny):
    results = new_results({}, "t")
    rows = stage_exactness(tiny, {"splits": ["1,1"], "prompts": 1, "tokens": 6,
                                  "decodings": ["sequential", "prompt-lookup"]}, results)
    assert len(rows) == 2 and all(r["identical"] for r in rows)
    assert results["results"]["exactness/prompt-lookup/split=1,1"]["within_1e-4"]["value"] is True
    out = stage_rtt_model(tiny, {"split": "2,2", "rtt_ms": [0, 10, 20], "prompts": 1, "tokens": 6,
                                 "project_rtt_ms": [5, 80]}, results)
    fit = out["sequential"]
    assert len(fit["cv"]["folds"]) == 3 and [m["rtt_ms"] for m in fit["measured"]] == [0.0, 10.0, 20.0]
    assert "loo_rtt_mean_rel_error" in results["results"]["rtt_model/sequential/split=2,2"]


def test_speed_stage_spread_brackets_the_block_ratios():
    steps = synthetic_steps(20.0, n=32)
    model = timing.fit_pooled({20.0: steps}, 100.0).project(20.0, 100.0)
    lo, hi = _spread(model, steps)
    assert lo <= hi and 0.9 < lo and hi < 1.1  # the model fits these steps: every block near 1
    assert _spread(model, steps[:3]) == (float("inf"), float("-inf"))  # no full block: no spread
