"""The defenses report's noise table (issue 28, findings 6 and 7) on hand-made stage data."""

from __future__ import annotations

import pytest

from benchmarks.defenses_noise import hidden_size, noise_lines
from splitinfer.defenses.noise_accounting import noise_accounting


def data(*labels, **extra):
    return {"rows": [{"depth": a, "defense": label} for a, label in labels], **extra}


def test_every_noise_row_gets_norm_snr_composed_epsilon_and_a_verdict():
    lines = noise_lines(data((2, "none"), (2, "noise(sigma=0.05,clip=66.55)"), (8, "noise(sigma=40,clip=1.0)"),
                             (8, "noise(sigma=0.0,clip=111.3)"), (2, "quant(format=int8)"), hidden_size=576))
    heading = next(line for line in lines if line.startswith("Noise in absolute terms"))
    assert "guarantee that text stays private" in heading and "not a guarantee" in heading
    assert "epsilon = 10" in heading and "128 + 128" in heading
    rows = [line for line in lines if line.startswith("| 2 |") or line.startswith("| 8 |")]
    assert len(rows) == 2  # no row for the undefended, quantised, or clip-only (sigma = 0) rows
    weak, strong = rows
    acc = noise_accounting(0.05, 66.55, 576)
    assert f"| 79.8 (1.20) | 0.834 | {acc.eps_vector:.3g} |" in weak  # the norm is 1.2x the clip norm, as the issue says
    assert weak.endswith("| no meaningful protection (epsilon > 10) |")
    strong_acc = noise_accounting(40.0, 1.0, 576)
    assert strong_acc.eps_prompt <= 10 and "a formal bound, not evidence" in strong
    assert f"| {strong_acc.eps_prompt:.3g} |" in strong


def test_hidden_size_comes_from_the_data_or_the_overhead_rows():
    assert hidden_size({"hidden_size": 640}) == 640
    assert hidden_size({"overhead": [{"defense": "quant(format=int8)", "d": 576, "tokens": 1}]}) == 576
    assert hidden_size({}) is None
    assert noise_lines(data((2, "noise(sigma=0.05,clip=1.0)"))) == []  # d unknown: no table rather than a guess


@pytest.mark.parametrize("label", ["noise(sigma=0.05,clip=2.0,delta=1e-6)"])
def test_the_rows_delta_is_used_and_shown(label):
    lines = noise_lines(data((2, label), hidden_size=64))
    assert any("delta = 1e-06" in line for line in lines)
    acc = noise_accounting(0.05, 2.0, 64, delta=1e-6)
    assert any(f"| {acc.eps_vector:.3g} |" in line for line in lines)
