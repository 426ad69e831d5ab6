import pytest

from benchmarks.stages import STAGES, get_stage, stage_config
from benchmarks.suite import load_suite
from splitinfer.cli import main
from splitinfer.errors import SplitInferError


def test_every_stage_is_registered_once_with_an_importable_entry():
    assert list(STAGES) == ["exactness", "speed", "rtt_model", "ngram_ablation", "attacks", "defenses"]
    for stage in STAGES.values():
        assert callable(stage.function()), stage.entry
    with pytest.raises(SplitInferError, match="unknown stage 'nope'; known: exactness, speed"):
        get_stage("nope")


def test_stage_configs_are_frozen_and_check_types():
    cfg = get_stage("speed").config.from_table({"rtt_ms": [20, 80], "bandwidth_mbps": 100, "budget_s": 30}, "s [speed]")
    assert cfg.bandwidth_mbps == 100 and cfg.budget_s == 30
    assert cfg.table() == {"rtt_ms": [20, 80], "bandwidth_mbps": 100}  # what the stage reads: no budget, no unset keys
    with pytest.raises(AttributeError):
        cfg.tokens = 3
    for table, message in (({"tokens": True}, "tokens must be int, got True"),
                           ({"splits": "2,2"}, "splits must be list"),
                           ({"budget_s": 0}, "budget_s must be > 0"),
                           ({"budget_s": "1m"}, "budget_s must be float"),
                           ({"budget_s": float("nan")}, "budget_s must be a finite number"),
                           ({"budget_s": float("inf")}, "budget_s must be a finite number"),
                           ({"prompt": 1}, "unknown key 'prompt'; allowed: budget_s, decodings, prompts")):
        with pytest.raises(SplitInferError, match=message):
            get_stage("exactness").config.from_table(table, "s [exactness]")
    with pytest.raises(SplitInferError, match="rtt_ms must hold finite numbers"):
        get_stage("speed").config.from_table({"rtt_ms": [20, float("nan")]}, "s [speed]")


def test_stage_keys_are_declared_as_key_type_pairs():
    config = stage_config("my_stage", "items:list count:int")
    assert config.__name__ == "MyStageConfig"
    assert config.from_table({"items": [1], "count": 2}, "s").table() == {"items": [1], "count": 2}
    with pytest.raises(SplitInferError, match="key 'count' has type 'integer'; use one of list, dict"):
        stage_config("my_stage", "count:integer")


def test_committed_suites_give_budgets_that_fit_the_quick_limit():
    quick = load_suite("quick")
    budgets = [quick.budget_s(s) for s in quick.stages]
    # 10 minutes on 2 cores; loading the model and the report took 5 s of the 579 s run at 2fc7170
    assert None not in budgets and sum(budgets) <= 600 - 10
    assert "budget_s" not in quick.stages["speed"]  # stage functions see only their own keys


def test_bench_ls_lists_suites_and_stages(capsys):
    assert main(["bench", "ls"]) == 0
    out = capsys.readouterr().out
    assert "quick" in out and "ci" in out and "speed (85 s)" in out
    for name in STAGES:
        assert name in out


def test_bench_validate_one_line_per_suite(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nmodel = "tiny-random"\n[speed]\nbudget_s = -1\n')
    assert main(["bench", "validate", "ci", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out.strip().endswith("ci.toml: ok (5 stages: exactness, speed, rtt_model, attacks, defenses; budgets sum to 175 s)")
    assert err.strip().splitlines() == [f"splitinfer: error: {bad} [speed]: budget_s must be > 0 seconds, got -1"]
    assert main(["bench", "validate", "ci"]) == 0
