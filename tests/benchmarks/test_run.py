import json

import pytest
import torch

from benchmarks import schema
from benchmarks.run import budget_line, run_suite
from benchmarks.suite import load_suite
from splitinfer.errors import SplitInferError

SUITE = """name = "mini"
model = "tiny-random"
seed = 0

[exactness]
budget_s = 600
splits = ["2,2"]
prompts = 1
tokens = 4
decodings = ["sequential"]

[rtt_model]
split = "2,2"
decodings = ["sequential"]
rtt_ms = [0, 5, 10]
bandwidth_mbps = 100
prompts = 1
tokens = 6
project_rtt_ms = [5, 20]
"""


def test_budget_line():
    assert budget_line("speed", 61.24, 90) == "stage speed: 61.2 s (budget 90 s)"
    assert budget_line("speed", 91.0, 90).endswith("OVER BUDGET")
    assert budget_line("attacks", 3.0, None) == "stage attacks: 3.0 s (no budget)"


def test_run_suite_records_stage_times_and_budgets(tmp_path, capsys):
    path = tmp_path / "mini.toml"
    path.write_text(SUITE)
    suite = load_suite(str(path))
    out = run_suite(suite, tmp_path / "out")
    results = schema.load(out)
    assert results["schema_minor"] == schema.SCHEMA_MINOR
    assert results["results"]["exactness/sequential/split=2,2"]["identical_share"]["value"] == 1.0
    assert results["results"]["harness/stage=exactness"]["budget_s"]["value"] == 600
    assert results["results"]["harness/stage=rtt_model"]["budget_s"]["value"] is None
    data = results["data"]
    assert set(data["stage_seconds"]) == {"exactness", "rtt_model"} and data["stage_budget_s"]["exactness"] == 600
    err = capsys.readouterr().err
    assert "stage exactness: " in err and "(budget 600 s)" in err and "stage rtt_model: " in err
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Stage times" in report and "| exactness |" in report
    assert json.loads(out.read_text())["config"]["stages"]["exactness"]["splits"] == ["2,2"]
    # a subset of the stages; a stage the suite does not have is a one-line error before any work
    run_suite(suite, tmp_path / "only", stages=["rtt_model"])
    assert "exactness" not in schema.load(tmp_path / "only" / "results.json")["data"]
    with pytest.raises(SplitInferError, match="--stages speed: not in suite 'mini'"):
        run_suite(suite, tmp_path / "x", stages=["speed"])


def test_bench_report_into_a_new_directory(tmp_path, capsys):
    """`bench report --out NEW` creates the directory (it died with FileNotFoundError on the first plot)."""
    from pathlib import Path

    from splitinfer.cli import main

    results = Path(__file__).resolve().parents[2] / "reports" / "baseline" / "ci.json"
    assert main(["bench", "report", "--results", str(results), "--out", str(tmp_path / "new" / "dir")]) == 0
    assert (tmp_path / "new" / "dir" / "report.md").is_file()


def test_bench_run_device_overrides_the_suite_and_refuses_a_missing_gpu(tmp_path, capsys):
    from splitinfer.cli import main

    path = tmp_path / "mini.toml"
    path.write_text(SUITE)
    out = tmp_path / "out"
    assert main(["bench", "run", "--suite", str(path), "--stages", "rtt_model", "--device", "cpu",
                 "--out", str(out)]) == 0
    assert schema.load(out / "results.json")["config"]["device"] == "cpu"
    if not torch.cuda.is_available():  # a missing GPU is a one-line error before any work, nothing written
        assert main(["bench", "run", "--suite", str(path), "--device", "cuda", "--out", str(tmp_path / "g")]) == 2
        assert "CUDA is not available here" in capsys.readouterr().err and not (tmp_path / "g").exists()


def test_bench_run_refuses_what_bench_validate_refuses_before_the_model_loads(tmp_path, capsys):
    # an option typo used to surface when its stage built the attacker, after the model had loaded
    from splitinfer.cli import main

    path = tmp_path / "typo.toml"
    path.write_text(SUITE + '\n[defenses]\noptions = { "linear-probe" = { epoch = 1 } }\n')
    out = tmp_path / "out"
    assert main(["bench", "run", "--suite", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "[defenses] options: attack 'linear-probe' has no hyper-parameter(s) ['epoch']" in err[0]
    assert not out.exists()
    path.write_text(SUITE + '\n[defenses]\nattackers = ["nope"]\noptions = { "mlp" = { lr = "fast" } }\n')
    assert main(["bench", "run", "--suite", str(path), "--out", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "attackers: unknown attack 'nope'" in line and line.endswith(f"(and 1 more: splitinfer bench validate {path})")
