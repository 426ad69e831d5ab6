"""benchmarks.plots_defenses: the frontier plot's interval bars and drawing order."""

from pathlib import Path

import pytest

from benchmarks.plots_defenses import draw_order, error_bars, plot_frontier


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
