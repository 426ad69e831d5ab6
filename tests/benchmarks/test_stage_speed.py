"""The speed stage's measured spread of the efficiency metric (what regress widens its tolerance to)."""

from benchmarks.stage_speed import _spread
from splitinfer import timing
from tests.splitinfer.test_timing_rtt import synthetic_steps


def test_speed_stage_spread_brackets_the_block_ratios():
    steps = synthetic_steps(20.0, n=32)
    model = timing.fit_pooled({20.0: steps}, 100.0).project(20.0, 100.0)
    lo, hi = _spread(model, steps)
    assert lo <= hi and 0.9 < lo and hi < 1.1  # the model fits these steps: every block near 1
    assert _spread(model, steps[:3]) == (float("inf"), float("-inf"))  # no full block: no spread
