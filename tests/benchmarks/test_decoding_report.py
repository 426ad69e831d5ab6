"""Decoding report plots: the ablation figure only when the run has ablation rows."""

from __future__ import annotations

from benchmarks import decoding_report as dr
from benchmarks.prompts import CATEGORIES


def _row(tau: float) -> dict:
    row = {"tau": {**{c: tau for c in CATEGORIES}, "mean": tau}}
    for kind in ("cpu", "flat"):
        for rtt in dr.RTTS:
            row[f"{kind}@{rtt:g}"] = {c: 5.0 * tau for c in CATEGORIES}
    return row


def test_ablation_figure_only_with_ablation_rows(tmp_path, monkeypatch) -> None:
    # Regression: a --no-ablation run used to write a decoding_ablation.png with three empty panels.
    table = {"sequential": _row(1.0), "combined": _row(2.0)}
    monkeypatch.setattr(dr, "summarize", lambda results: table)
    assert [p.name for p in dr.plot({}, tmp_path)] == ["decoding_tau.png"]
    table.update({f"suffix T={t}": _row(1.5) for t in (8, 16, 32, 64)})
    paths = dr.plot({}, tmp_path)
    assert [p.name for p in paths] == ["decoding_tau.png", "decoding_ablation.png"]
    assert all(p.stat().st_size > 0 for p in paths)
