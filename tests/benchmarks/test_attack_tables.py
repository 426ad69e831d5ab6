"""Report cells for attack metrics: scope, n/a intervals, lift, n beside PII, paired comparisons (issue 14)."""

from __future__ import annotations

import numpy as np

from attacks import metrics as M
from benchmarks.attack_tables import SCOPE, baseline_line, cell, compare, metrics_cells, pii_cell


def _summary() -> dict:
    train = np.array([7, 8, 5, 2, 7, 8, 5, 2, 1, 1, 1, 1])  # unigram guess 1; position guesses 7 8 5 2
    prior = M.TokenPrior.fit(train, np.array([0, 1, 2, 3] * 3), k=1)
    test = [np.array([7, 8, 5, 2]), np.array([7, 8, 5, 1]), np.array([7, 8, 3, 2])]
    guess = [t.copy()[:, None] for t in test]
    guess[0][3, 0] = 0
    mask = [np.array([True, True, False, False])] * 3
    return M.summarize(test, guess, ks=(1,), prior=prior, positions=[np.arange(4)] * 3, template_mask=mask,
                       vocab_size=100, n_boot=100)


def test_cells_say_na_and_signed_lift() -> None:
    assert cell({"value": 0.5, "ci_low": None, "ci_high": None}) == "50.0 [n/a]"
    assert cell({"value": 0.1, "ci_low": -0.05, "ci_high": 0.2}, signed=True) == "+10.0 [-5.0, +20.0]"
    assert pii_cell({"value": 1.0, "ci_low": 0.9, "ci_high": 1.0, "n": 36}).endswith("(n=36)")
    assert "user text" in SCOPE and "n/a" in SCOPE


def test_metrics_cells_and_baseline_line_name_the_scope_and_strongest_baseline() -> None:
    m = _summary()
    cells = metrics_cells(m)
    assert cells[0].startswith("83.3")  # 5 of 6 user-text tokens
    assert cells[1].endswith("vs position")
    assert cells[2].startswith("100.0")  # template tokens scored apart
    assert cells[-1] == "6 / 3"
    line = baseline_line(m)
    assert "user text" in line and "position" in line and "template tokens" in line


def test_compare_uses_a_paired_bootstrap_over_shared_documents() -> None:
    rng = np.random.default_rng(0)
    total = rng.integers(20, 40, size=30)
    a = np.round(total * rng.uniform(0.2, 0.8, size=30)).astype(int)
    row_a = {"doc_top1": {"doc_ids": [f"d{i}" for i in range(30)], "correct": a.tolist(), "total": total.tolist()}}
    row_b = {"doc_top1": {"doc_ids": [f"d{i}" for i in range(30)][::-1], "correct": np.maximum(a - 3, 0)[::-1].tolist(),
                          "total": total[::-1].tolist()}}  # same documents, another order
    out = compare(row_a, row_b)
    assert out.startswith("+") and out.endswith(", significant")
    assert compare(row_a, row_a).endswith("not significant")
    assert compare(row_a, {}) == "n/a (no per-document counts)"
