"""benchmarks.plots_defenses: the frontier plot's interval bars and drawing order."""

from pathlib import Path

import pytest

from benchmarks.plots_defenses import draw_order, error_bars, plot_frontier, plot_speed, speed_points


def _row(value, lo, hi, family="noise") -> dict:
    return {"family": family, "next_token_agreement": 0.5, "modelled_tok_s_80ms": 8.0,
            "best": {"top1": {"value": value, "ci_low": lo, "ci_high": hi}}}


def test_an_interval_that_starts_at_zero_keeps_its_lower_bar() -> None:
    """12.5% [0.0, 25.0] (the quick suite's sigma=0.25 rows): the bar goes down to 0, not nowhere."""
    lo, hi = error_bars([_row(0.125, 0.0, 0.25), _row(0.5, None, None)])
    assert lo == pytest.approx([12.5, 0.0]) and hi == pytest.approx([12.5, 0.0])


def test_the_plot_is_written(tmp_path: Path) -> None:
    rows = [_row(1.0, 0.8, 1.0, "none"), _row(0.125, 0.0, 0.25)]
    assert plot_frontier(rows, tmp_path / "f.png", 2).stat().st_size > 1000
    assert plot_frontier([], tmp_path / "g.png", 2) is None


def test_the_undefended_point_is_drawn_last() -> None:
    """The full grid's permute rows sit at (100, 100), on the undefended point, and were drawn over it (the grid's
    rows come `none` first): `none` goes last, so its marker stays visible."""
    rows = [_row(1.0, 0.9, 1.0, "none"), _row(0.5, 0.4, 0.6, "noise"), _row(1.0, 0.9, 1.0, "permute")]
    assert draw_order(rows) == ["noise", "permute", "none"]
    assert draw_order([_row(0.5, 0.4, 0.6, "quant")]) == ["quant"]


def _speed_row(depth, defense, agreement, value, speeds=None) -> dict:
    row = {"depth": depth, "defense": defense, "family": defense.split("(")[0], "next_token_agreement": agreement,
           "modelled_tok_s_80ms": 7.5, "best": {"top1": {"value": value, "ci_low": value - 0.1, "ci_high": value}}}
    return {**row, "tok_s_80ms": speeds} if speeds else row


def test_one_speed_point_per_depth_defense_and_decoding() -> None:
    speeds = {"sequential": {"cpu": 7.5, "gpu_flat": 7.9}, "combined": {"cpu": 8.2, "gpu_flat": 11.0}}
    rows = [_speed_row(2, "none", 1.0, 1.0, speeds), _speed_row(8, "quant(format=int8)", 0.94, 1.0, speeds),
            _speed_row(2, "noise(sigma=0.05,clip=66.55)", 0.115, 0.631, speeds)]
    cpu, gpu = speed_points(rows, "cpu"), speed_points(rows, "gpu_flat")
    assert len(cpu) == len(gpu) == 6
    assert {(p["depth"], p["defense"], p["decoding"]) for p in gpu} == \
        {(r["depth"], r["defense"], d) for r in rows for d in ("sequential", "combined")}
    by = {(p["defense"], p["decoding"]): p for p in gpu}
    assert by[("none", "combined")]["tok_s"] == 11.0 and by[("none", "sequential")]["tok_s"] == 7.9
    noisy = by[("noise(sigma=0.05,clip=66.55)", "combined")]
    assert not noisy["usable"] and noisy["recovery"] == pytest.approx(63.1)  # below the 90% floor: unusable
    assert by[("quant(format=int8)", "sequential")]["usable"]  # 94% agreement
    assert noisy["below"] == pytest.approx(10.0) and noisy["above"] == 0.0


def test_a_grid_without_speed_columns_gives_its_cpu_combined_figure_only(tmp_path: Path) -> None:
    """The committed full grid (78da72b) stored one tok/s per row (combined, this CPU): no GPU projection."""
    rows = [_speed_row(2, "none", 1.0, 1.0), _speed_row(8, "none", 1.0, 1.0)]
    assert [(p["decoding"], p["tok_s"]) for p in speed_points(rows, "cpu")] == [("combined", 7.5)] * 2
    assert speed_points(rows, "gpu_flat") == []
    assert plot_speed(rows, tmp_path / "old.png").stat().st_size > 1000  # the GPU panel says it was not measured


def test_the_speed_plot_is_written(tmp_path: Path) -> None:
    speeds = {"sequential": {"cpu": 7.5, "gpu_flat": 7.9}, "combined": {"cpu": 8.2, "gpu_flat": 11.0}}
    rows = [_speed_row(2, "none", 1.0, 1.0, speeds), _speed_row(2, "noise(sigma=0.25,clip=1)", 0.05, 0.1, speeds)]
    assert plot_speed(rows, tmp_path / "s.png").stat().st_size > 1000
    assert plot_speed([], tmp_path / "e.png") is None


def test_a_run_without_a_decode_step_gives_no_speed_point(tmp_path: Path) -> None:
    """Full grid job 6: `combined` stopped at every first token and stored 0.0; it was drawn at 0 tok/s."""
    speeds = {"sequential": {"cpu": 8.3, "gpu_flat": 8.3}, "combined": {"cpu": 0.0, "gpu_flat": 0.0}}
    new = {"sequential": {"cpu": 8.3, "gpu_flat": 8.3}, "combined": {"cpu": None, "gpu_flat": None}}
    for cols in (speeds, new):
        rows = [_speed_row(2, "noise(sigma=0.02,clip=66.55)", 0.41, 0.92, cols)]
        assert [p["decoding"] for p in speed_points(rows, "cpu")] == ["sequential"]
    row = {**_row(0.92, 0.91, 0.93), "modelled_tok_s_80ms": None}
    assert plot_frontier([row, _row(1.0, 0.96, 1.0, "none")], tmp_path / "f.png", 2).stat().st_size > 1000
