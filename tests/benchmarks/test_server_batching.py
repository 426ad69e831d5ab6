"""``splitinfer bench batching`` on the tiny model: recorded frames replayed against real servers."""

from __future__ import annotations

import pytest

from benchmarks import schema
from benchmarks.server_batching import record
from splitinfer.cli import main
from splitinfer.partition import SplitConfig

N_TOKENS = 3


def test_bench_batching_counts_the_replayed_tokens_server_side(tiny, tmp_path, capsys):
    out = tmp_path / "batching.json"
    assert main(["bench", "batching", "--model", "tiny-random", "--sessions", "1,3", "--rtt-ms", "0",
                 "--max-new-tokens", str(N_TOKENS), "--out", str(out)]) == 0
    doc = schema.load(out)
    assert doc["suite"] == "bench-batching"
    recordings = record(tiny, SplitConfig(2, 2), N_TOKENS, "fp16")
    decode = [sum(len(f["positions"]) for op, f, _ in r[1:] if op == "forward") for r in recordings]
    for row in doc["data"]["rows"]:
        k = row["sessions"]
        assert row["body_tokens"] == sum(decode[i % len(decode)] for i in range(k)), row  # the server's own count
        assert row["kv_bytes_per_session"] > 0 and row["max_abs_diff"] < 1e-3
        best = max(r["body_tok_s"] for r in doc["data"]["rows"] if r["mode"] == "unbatched")
        assert row["speedup_vs_best_unbatched"] == row["body_tok_s"] / best  # against its best concurrency
        forwards = sum(op == "forward" for i in range(k) for op, _, _ in recordings[i % len(recordings)][1:])
        assert row["steps_timed"] == forwards  # every decode forward of every session timed, commits not
        assert 0 < row["step_ms_p50"] <= row["step_ms_p90"]
        unb = next(r for r in doc["data"]["rows"] if r["mode"] == "unbatched" and r["sessions"] == k)
        assert row["p50_vs_unbatched"] == row["step_ms_p50"] / unb["step_ms_p50"]
    assert doc["results"]["batching/mode=unbatched/rtt=0/sessions=3"]["speedup"]["value"] == 1.0
    assert doc["results"]["batching/mode=batched/rtt=0/sessions=3"]["step_ms_p50"]["unit"] == "ms"
    assert "p50 ms" in capsys.readouterr().out
    runs = doc["data"]["runs"]
    assert doc["data"]["repeats"] == 3 and len(runs) == 3 * len(doc["data"]["rows"])  # every cell 3 times
    for row in doc["data"]["rows"]:
        mine = sorted(r["body_tok_s"] for r in runs if (r["mode"], r["sessions"]) == (row["mode"], row["sessions"]))
        assert row["body_tok_s"] == mine[1] and (row["body_tok_s_min"], row["body_tok_s_max"]) == (mine[0], mine[2])
        assert row["speedup_vs_best_unbatched_min"] <= row["speedup_vs_best_unbatched_max"]


def test_summarise_pairs_each_repeat_with_its_own_unbatched_best():
    from benchmarks.server_batching import summarise

    def run(mode, k, rep, tok):
        return {"mode": mode, "rtt_ms": 80.0, "sessions": k, "repeat": rep, "body_tok_s": tok, "step_ms_p50": 10.0,
                "step_ms_p90": 20.0, "steps": 8, "forwards": 4}

    runs = [run("unbatched", 1, 0, 10.0), run("unbatched", 8, 0, 20.0), run("batched", 8, 0, 40.0),
            run("unbatched", 1, 1, 10.0), run("unbatched", 8, 1, 25.0), run("batched", 8, 1, 40.0),
            run("unbatched", 1, 2, 10.0), run("unbatched", 8, 2, 22.0), run("batched", 8, 2, 44.0)]
    rows = {(r["mode"], r["sessions"]): r for r in summarise(runs)}
    b8 = rows["batched", 8]
    assert b8["body_tok_s"] == 40.0 and rows["unbatched", 8]["body_tok_s"] == 22.0  # medians
    assert b8["speedup_vs_best_unbatched"] == 40.0 / 22.0  # median over median best
    assert (b8["speedup_vs_best_unbatched_min"], b8["speedup_vs_best_unbatched_max"]) == (40.0 / 25.0, 2.0)
    assert b8["best_unbatched_sessions"] == 8 and b8["steps"] / b8["forwards"] == 2.0


def test_bad_repeats_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "batching", "--model", "tiny-random", "--repeats", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "argument --repeats: 0 must be >= 1" in err[0]


def test_percentile_is_nearest_rank():
    from benchmarks.server_batching import _percentile

    xs = [float(i) for i in range(1, 11)]
    assert (_percentile(xs, 50), _percentile(xs, 90), _percentile([3.0], 50)) == (5.0, 9.0, 3.0)


def test_bad_batch_setting_is_one_line(capsys):
    assert main(["bench", "batching", "--model", "tiny-random", "--max-batch", "0"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max-batch" in err[0]
