"""bench baseline: repeated runs folded into one baseline; timing spread between runs, determinism of the rest."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from benchmarks import regress, schema
from benchmarks.baseline import fold


def _run(eff: float, lo: float, hi: float, acc: float = 0.75, wall: float = 3.0) -> dict:
    doc = schema.new_results({"model": "tiny-random", "seed": 0}, "ci")
    schema.add_metric(doc, "speed/x", "efficiency", schema.metric(eff, lo, hi, 10, kind="efficiency"))
    schema.add_metric(doc, "attacks/x", "token_acc_top1", schema.metric(acc, acc - 0.1, acc + 0.1, 50, kind="accuracy"))
    schema.add_metric(doc, "attacks/x", "identical", schema.metric(True, kind="exact"))
    schema.add_metric(doc, "harness/stage=speed", "wall_s", schema.metric(wall, kind="info"))
    return doc


def _docs(*runs: dict) -> list[tuple[Path, dict]]:
    return [(Path(f"run-{i}/results.json"), r) for i, r in enumerate(runs)]


def test_efficiency_takes_the_median_and_an_interval_over_every_run() -> None:
    out = fold(_docs(_run(1.00, 0.98, 1.01), _run(0.90, 0.89, 0.93), _run(0.95, 0.94, 0.96, wall=5.0)))
    m = out["results"]["speed/x"]["efficiency"]
    assert (m["value"], m["ci_low"], m["ci_high"], m["n"]) == (0.95, 0.89, 1.01, 30)
    assert out["results"]["harness/stage=speed"]["wall_s"]["value"] == 3.0  # info: the first run's
    assert out["results"]["attacks/x"]["token_acc_top1"]["value"] == 0.75 and out["baseline_runs"] == 3
    schema.validate(out)


def test_regress_tolerates_a_rerun_inside_the_measured_run_to_run_spread() -> None:
    one = _run(1.146, 1.14, 1.15)  # one run: a tight within-run spread
    folded = fold(_docs(one, _run(0.945, 0.94, 0.95), _run(1.05, 1.04, 1.06)))
    rerun = _run(0.96, 0.95, 0.97)
    assert [r.rule for r in regress.compare(one, rerun, 0.15)] == ["efficiency"]  # flagged against one run
    assert regress.compare(folded, rerun, 0.15) == []  # inside the spread measured between runs


def test_a_metric_that_should_be_deterministic_but_varies_is_refused() -> None:
    with pytest.raises(schema.SchemaError, match=r"token_acc_top1.*must not vary between runs"):
        fold(_docs(_run(1.0, 0.9, 1.1), _run(1.0, 0.9, 1.1, acc=0.76)))


def test_runs_of_other_commits_or_configs_or_too_few_runs_are_refused() -> None:
    a = _run(1.0, 0.9, 1.1)
    b = copy.deepcopy(a)
    b["git_hash"] = "0" * 40
    with pytest.raises(schema.SchemaError, match="git_hash differs"):
        fold(_docs(a, b))
    c = copy.deepcopy(a)
    c["config"]["seed"] = 1
    with pytest.raises(schema.SchemaError, match="config differs"):
        fold(_docs(a, c))
    d = copy.deepcopy(a)
    del d["results"]["attacks/x"]["identical"]
    with pytest.raises(schema.SchemaError, match="identical.*missing"):
        fold(_docs(a, d))
    with pytest.raises(schema.SchemaError, match="at least 2 results files"):
        fold(_docs(a))


def test_bench_baseline_cli_writes_a_valid_document(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from splitinfer.cli import main

    paths = [schema.save(_run(1.0 - i / 100, 0.9, 1.1), tmp_path / f"r{i}" / "results.json") for i in range(2)]
    assert main(["bench", "baseline", str(tmp_path / "ci.json"), str(paths[0].parent), str(paths[1])]) == 0
    assert schema.load(tmp_path / "ci.json")["baseline_runs"] == 2
    assert main(["bench", "baseline", str(tmp_path / "bad.json"), str(paths[0])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "at least 2 results files" in err[0]


def test_a_metric_or_run_missing_from_the_first_run_is_refused_too() -> None:
    """Folding does not depend on the order of the runs: a metric (or run) only some runs have is refused
    wherever it is missing, not silently left out of the baseline (regress never checks what it lacks)."""
    a = _run(1.0, 0.9, 1.1)
    d = copy.deepcopy(a)
    del d["results"]["attacks/x"]["identical"]
    with pytest.raises(schema.SchemaError, match=r"run-0.*identical.*missing"):
        fold(_docs(d, a))
    e = copy.deepcopy(a)
    del e["results"]["speed/x"]
    with pytest.raises(schema.SchemaError, match=r"run-0.*speed/x.*missing"):
        fold(_docs(e, a, a))


def test_an_efficiency_metric_without_a_sample_count_keeps_none() -> None:
    """bench speed --out writes efficiency with n = None: the fold must not invent n = 0 samples."""
    runs = [_run(1.0, 0.9, 1.1), _run(0.95, 0.9, 1.0)]
    for r in runs:
        r["results"]["speed/x"]["efficiency"]["n"] = None
    assert fold(_docs(*runs))["results"]["speed/x"]["efficiency"]["n"] is None


def test_one_run_given_twice_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from splitinfer.cli import main

    run = tmp_path / "run" / "results.json"
    schema.save(_run(0.9, 0.85, 0.95), run)
    assert main(["bench", "baseline", str(tmp_path / "base.json"), str(run), str(run.parent)]) == 2
    assert "is given twice" in capsys.readouterr().err and not (tmp_path / "base.json").exists()
