"""bench speed on the tiny model: the bound's compute is our own unsplit runtime, transformers beside it."""

from benchmarks.speed import efficiency_range, format_speed, own_unsplit_ms_per_token, run_speed
from splitinfer.client import SplitModel
from splitinfer.partition import SplitConfig


def test_own_unsplit_loop_decodes_what_the_split_model_decodes(tiny, monkeypatch):
    sm = SplitModel(tiny, "2,2", wire_dtype="fp32")
    ids = sm.encode_prompt("the cat sat on the mat")
    seen = []
    real_tail = type(sm.tail).forward

    def spy(self, *a, **k):
        out = real_tail(self, *a, **k)
        seen.append(int(out[0, -1].argmax()))
        return out

    monkeypatch.setattr(type(sm.tail), "forward", spy)
    samples = own_unsplit_ms_per_token(sm, ids, 6, repeats=1)
    monkeypatch.undo()
    assert len(samples) == 1 and samples[0] > 0
    ref = sm.generate(ids, 7, stop_on_eos=False).token_ids
    assert seen[-7:] == ref  # the last (timed) repeat: prefill + 6 steps, the same greedy tokens


def test_run_speed_reports_the_own_bound_and_transformers_as_a_reference(tiny):
    r = run_speed(tiny, SplitConfig(2, 2), [0.0, 5.0], n_tokens=6, wire="fp32")
    assert len(r["unsplit_ms_per_token_samples"]) == 6 and r["efficiency_spread"] >= 0
    assert r["unsplit_ms_per_token"] == min(r["unsplit_ms_per_token_samples"])
    for row in r["rows"]:
        bound_ms = row["rtt_ms"] + r["unsplit_ms_per_token"] + row["transfer_ms"]
        assert abs(row["bound_tok_s"] - 1e3 / bound_ms) < 1e-9
        assert abs(row["efficiency"] - row["measured_tok_s"] / row["bound_tok_s"]) < 1e-9
        assert row["transformers_bound_tok_s"] > 0
        assert row["efficiency_low"] <= row["efficiency"] <= row["efficiency_high"]
    text = format_speed(r)
    assert "our own runtime" in text and "transformers generate (reference)" in text


def test_efficiency_range_spans_the_bound_samples_and_the_step_blocks():
    low, high = efficiency_range(100.0, 10.0, [90.0, 100.0, 125.0])
    assert low == 100.0 / 125.0 and high == 110.0 / 90.0
