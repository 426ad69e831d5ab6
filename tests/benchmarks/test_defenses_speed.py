"""benchmarks.defenses_speed: the speed columns of a defense row, and a run with no decode step."""

from types import SimpleNamespace

import pytest

from benchmarks.defenses_speed import measured_tok_s, speed_columns
from splitinfer.timing import StepTiming


def _run(decode_steps: int) -> SimpleNamespace:
    """One generation: a prefill step that commits the first token, then ``decode_steps`` one-token steps."""
    steps = [StepTiming(head_ms=2.0, body_ms=20.0, tail_ms=2.0, total_ms=30.0, tokens_sent=12, tokens_committed=1)]
    steps += [StepTiming(head_ms=1.0, body_ms=8.0, tail_ms=1.0, total_ms=12.0, tokens_sent=1, tokens_committed=1)
              for _ in range(decode_steps)]
    return SimpleNamespace(steps=steps, token_ids=list(range(1 + decode_steps)))


def test_decode_steps_give_a_positive_speed_on_both_cost_bases() -> None:
    cols = speed_columns({"sequential": [_run(6), _run(4)]})["tok_s_80ms"]["sequential"]
    assert cols["cpu"] > 0 and cols["gpu_flat"] > 0
    assert cols["cpu"] < 1e3 / 80  # one token per round trip of at least 80 ms


def test_generations_that_stop_at_their_first_token_have_no_speed_not_zero() -> None:
    """Full grid job 6 (noise 0.02 x C, head 2): both `combined` generations stopped at the first token and the
    row said 0.00 tok/s at 80 ms, plotted as a point at 0 and quoted in the seed answers."""
    cols = speed_columns({"combined": [_run(0), _run(0)], "sequential": [_run(3)]})["tok_s_80ms"]
    assert cols["combined"] == {"cpu": None, "gpu_flat": None}
    assert cols["sequential"]["cpu"] > 0


@pytest.mark.parametrize("stored, read", [(None, None), (0.0, None), (8.4, 8.4)])
def test_a_stored_zero_reads_as_not_measured(stored, read) -> None:
    """Grids run before None was written (the committed ec10d2d shards) stored 0.0 for no decode step."""
    assert measured_tok_s(stored) == read
