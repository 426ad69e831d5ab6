"""``splitinfer bench batching`` on the tiny model: recorded frames replayed against real servers."""

from __future__ import annotations

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


def test_percentile_is_nearest_rank():
    from benchmarks.server_batching import _percentile

    xs = [float(i) for i in range(1, 11)]
    assert (_percentile(xs, 50), _percentile(xs, 90), _percentile([3.0], 50)) == (5.0, 9.0, 3.0)


def test_bad_batch_setting_is_one_line(capsys):
    assert main(["bench", "batching", "--model", "tiny-random", "--max-batch", "0"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max-batch" in err[0]
