"""Tests of the baseline regression check (benchmarks.regress)."""

from __future__ import annotations

import argparse
import copy
import json

import pytest

from benchmarks import regress, schema


def make_baseline():
    res = schema.new_results({"model": {"id": "tiny-random", "sha256": "0" * 64}}, "ci")
    add = schema.add_metric
    add(res, "linear-probe/head:2", "token_acc_top1", schema.metric(0.80, 0.76, 0.84, n=500, kind="accuracy"))
    add(res, "linear-probe/head:2", "perplexity", schema.metric(10.0, 9.0, 11.0, higher_is_better=False, kind="accuracy"))
    add(res, "linear-probe/head:2", "baseline_uniform_top1", schema.metric(1e-4, kind="info"))
    add(res, "sequential/rtt:20", "token_identity", schema.metric(True, kind="exact"))
    add(res, "sequential/rtt:20", "tau", schema.metric(1.0, kind="exact"))
    add(res, "sequential/rtt:20", "efficiency", schema.metric(0.90, kind="efficiency"))
    add(res, "sequential/rtt:20", "tok_s", schema.metric(25.0, kind="info", unit="tok/s"))
    add(res, "combined/rtt:80", "tau", schema.metric(2.5, kind="exact"))
    return res


def perturbed(path, value):
    res = make_baseline()
    run, name, key = path
    res["results"][run][name][key] = value
    return res


def test_identical_results_pass():
    base = make_baseline()
    assert regress.compare(base, copy.deepcopy(base)) == []
    assert regress.count_compared(base, base) == 6  # 8 metrics, 2 of them info


def test_new_runs_and_metrics_are_fine():
    base = make_baseline()
    cur = copy.deepcopy(base)
    schema.add_metric(cur, "seq-decoder/head:8", "token_acc_top1", schema.metric(0.9, kind="accuracy"))
    schema.add_metric(cur, "sequential/rtt:20", "bytes_per_step", schema.metric(4096, kind="info"))
    assert regress.compare(base, cur) == []


@pytest.mark.parametrize(
    "path, value, rule",
    [
        (("sequential/rtt:20", "token_identity", "value"), False, "exact"),
        (("sequential/rtt:20", "tau", "value"), 1.0 + 1e-6, "exact"),
        (("combined/rtt:80", "tau", "value"), 2.4, "exact"),
        (("linear-probe/head:2", "token_acc_top1", "value"), 0.70, "accuracy"),
        (("linear-probe/head:2", "perplexity", "value"), 12.5, "accuracy"),
        (("sequential/rtt:20", "efficiency", "value"), 0.75, "efficiency"),
        (("sequential/rtt:20", "tok_s", "kind"), "efficiency", "kind"),
    ],
)
def test_each_perturbed_kind_fails(path, value, rule):
    base = make_baseline()
    found = regress.compare(base, perturbed(path, value))
    assert len(found) == 1
    r = found[0]
    assert (r.run, r.metric, r.rule) == (path[0], path[1], rule)
    assert r.current == (value if path[2] == "value" else 25.0)
    assert r.message and "\n" not in r.message
    assert path[1] in str(r)


@pytest.mark.parametrize(
    "path, value",
    [
        (("sequential/rtt:20", "tau", "value"), 1.0 + 1e-12),  # exact: within 1e-9
        (("linear-probe/head:2", "token_acc_top1", "value"), 0.77),  # drop 0.03 < CI width 0.08
        (("linear-probe/head:2", "token_acc_top1", "value"), 0.95),  # improvement
        (("linear-probe/head:2", "perplexity", "value"), 11.9),  # lower is better: rise 1.9 < width 2
        (("linear-probe/head:2", "perplexity", "value"), 3.0),  # lower is better: improvement
        (("sequential/rtt:20", "efficiency", "value"), 0.80),  # -11% within 15%
        (("sequential/rtt:20", "tok_s", "value"), 1.0),  # info: never compared
        (("linear-probe/head:2", "baseline_uniform_top1", "value"), 0.5),
    ],
)
def test_changes_within_tolerance_pass(path, value):
    assert regress.compare(make_baseline(), perturbed(path, value)) == []


def test_accuracy_without_ci_uses_tiny_tolerance():
    base = make_baseline()
    schema.add_metric(base, "r", "acc", schema.metric(0.5, kind="accuracy"))
    cur = copy.deepcopy(base)
    cur["results"]["r"]["acc"]["value"] = 0.5 - 1e-6
    assert [r.rule for r in regress.compare(base, cur)] == ["accuracy"]


def test_efficiency_tolerance_is_configurable():
    cur = perturbed(("sequential/rtt:20", "efficiency", "value"), 0.80)
    assert len(regress.compare(make_baseline(), cur, rel_tol_efficiency=0.05)) == 1
    with pytest.raises(ValueError, match="rel_tol_efficiency"):
        regress.compare(make_baseline(), cur, rel_tol_efficiency=1.5)


def test_missing_runs_and_metrics_are_regressions():
    base = make_baseline()
    cur = copy.deepcopy(base)
    del cur["results"]["combined/rtt:80"]
    del cur["results"]["sequential/rtt:20"]["efficiency"]
    found = regress.compare(base, cur)
    assert {(r.run, r.metric, r.rule) for r in found} == {
        ("sequential/rtt:20", "efficiency", "missing"),
        ("combined/rtt:80", "*", "missing"),
    }
    assert all(r.current is None for r in found)


def test_compare_validates_inputs():
    cur = make_baseline()
    cur["results"]["sequential/rtt:20"]["tau"]["ci_low"] = "x"
    with pytest.raises(schema.SchemaError, match=r"results\['sequential/rtt:20'\]\['tau'\]\.ci_low"):
        regress.compare(make_baseline(), cur)


# -- CLI ----------------------------------------------------------------------


@pytest.fixture
def files(tmp_path):
    base = tmp_path / "baseline.json"
    schema.save(make_baseline(), base)
    return tmp_path, base


def test_main_passes_on_identical(files, capsys):
    tmp_path, base = files
    assert regress.main(["--baseline", str(base), "--results", str(base)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["regress: 6 metrics compared, 0 regressions"]


def test_main_fails_and_names_each_regression(files, capsys):
    tmp_path, base = files
    cur = perturbed(("linear-probe/head:2", "token_acc_top1", "value"), 0.5)
    cur["results"]["sequential/rtt:20"]["efficiency"]["value"] = 0.1
    schema.save(cur, tmp_path / "cur.json")
    assert regress.main(["--baseline", str(base), "--results", str(tmp_path / "cur.json")]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 3
    assert "token_acc_top1" in out[0] and "linear-probe/head:2" in out[0]
    assert "efficiency" in out[1]
    assert out[2].startswith("regress: 2 REGRESSIONS")


def test_main_tolerance_option(files, capsys):
    tmp_path, base = files
    schema.save(perturbed(("sequential/rtt:20", "efficiency", "value"), 0.70), tmp_path / "cur.json")
    args = ["--baseline", str(base), "--results", str(tmp_path / "cur.json")]
    assert regress.main(args) == 1
    assert regress.main([*args, "--efficiency-tolerance", "0.3"]) == 0
    with pytest.raises(SystemExit) as info:
        regress.main([*args, "--efficiency-tolerance", "2"])
    assert info.value.code == 2


def test_main_bad_files_exit_2(files, capsys):
    tmp_path, base = files
    assert regress.main(["--baseline", str(tmp_path / "nope.json"), "--results", str(base)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.json: no such results file" in err[0]
    (tmp_path / "bad.json").write_text("{not json")
    assert regress.main(["--baseline", str(base), "--results", str(tmp_path / "bad.json")]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    doc = make_baseline()
    doc["results"]["sequential/rtt:20"]["tau"]["kind"] = "fast"
    (tmp_path / "invalid.json").write_text(json.dumps(doc))
    assert regress.main(["--baseline", str(base), "--results", str(tmp_path / "invalid.json")]) == 2
    assert "results['sequential/rtt:20']['tau'].kind" in capsys.readouterr().err


def test_add_arguments_and_run_mount_as_subcommand(files, capsys):
    tmp_path, base = files
    parser = argparse.ArgumentParser(prog="splitinfer")
    sub = parser.add_subparsers(dest="cmd")
    regress.add_arguments(sub.add_parser("regress"))
    args = parser.parse_args(["regress", "--baseline", str(base), "--results", str(base)])
    assert args.efficiency_tolerance == regress.DEFAULT_EFFICIENCY_TOL
    assert regress.run(args) == 0


def test_efficiency_tolerance_widens_to_the_baselines_measured_spread():
    base = make_baseline()
    base["results"]["sequential/rtt:20"]["efficiency"].update(ci_low=0.72, ci_high=1.08)  # 40% of 0.90
    cur = perturbed(("sequential/rtt:20", "efficiency", "value"), 0.60)  # -33%: noise for this run
    assert regress.compare(base, cur) == []
    cur = perturbed(("sequential/rtt:20", "efficiency", "value"), 0.50)  # -44%: beyond the spread
    assert [r.rule for r in regress.compare(base, cur)] == ["efficiency"]


def test_regress_and_report_take_a_run_directory_like_compare_and_merge(tmp_path, capsys):
    from splitinfer.cli import main
    from tests.benchmarks.test_report import fake_results

    run = tmp_path / "run"
    schema.save(fake_results(), run / "results.json")
    assert regress.load_migrated(str(run)) == regress.load_migrated(str(run / "results.json"))
    assert main(["bench", "report", "--results", str(run)]) == 0
    assert (run / "report.md").is_file() and str(run / "report.md") in capsys.readouterr().out
