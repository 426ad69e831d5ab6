"""The per-step timing of a wire defense alone."""

from benchmarks.defenses_overhead import overhead_ms


def test_overhead_is_measured() -> None:
    assert 0 < overhead_ms("quant(format=int8)", 64, reps=5) < 1e3
