import re

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


def test_stage_tables_refuse_items_and_values_a_run_would_misread():
    # these passed `bench validate` and failed only once the model was loaded and their stage ran
    cases = (("defenses", {"head_depths": [2, -1]}, "head_depths must hold numbers >= 1, got [2, -1]"),
             ("defenses", {"head_depths": [2, "8"]}, "head_depths must hold int values, got '8' in"),
             ("defenses", {"head_depths": [0]}, "head_depths must hold numbers >= 1"),
             ("defenses", {"paired_k": [0, -100]}, "paired_k must hold numbers >= 0"),
             ("defenses", {"defenses": ["none", 3]}, "defenses must hold str values, got 3"),
             ("defenses", {"greedy_prompts": -1}, "greedy_prompts must be >= 0, got -1"),
             ("defenses", {"time_budget_s": 0}, "time_budget_s must be > 0 seconds"),
             ("speed", {"rtt_ms": [20, -5]}, "rtt_ms must hold numbers >= 0"),
             ("speed", {"bandwidth_mbps": 0}, "bandwidth_mbps must be > 0, got 0"),
             ("exactness", {"splits": ["2,2", "abc"]}, "s: splits: bad split 'abc'; write it as HEAD,TAIL"),
             ("exactness", {"splits": ["0,2"]}, "bad split '0,2'; write it as HEAD,TAIL layer counts of at least 1"),
             ("exactness", {"tokens": 0}, "tokens must be >= 1, got 0"),
             ("speed", {"categories": ["code", "poetry"]}, "s: categories: unknown prompt category 'poetry'; choose "
              "from code, structured, creative, conversational"),
             ("rtt_model", {"split": "2"}, "s: split: bad split '2'; write it as HEAD,TAIL"),
             ("speed", {"wire_dtype": "fp64"}, "s: wire_dtype: unknown wire dtype 'fp64'; choose from fp16, fp32, bf16"),
             ("defenses", {"scored_set": {"docs_per_corpus": "six"}},  # int("six") raised ValueError in the stage
              "s: scored_set: scored_set.docs_per_corpus must be a whole number >= 0, got 'six'"),
             ("defenses", {"scored_set": {"docs": 6}}, "s: scored_set: scored_set has unknown key(s) ['docs']"),
             # the ablation ran its fixed n = 3..7 over every category whatever these said
             ("ngram_ablation", {"n": [3]}, "unknown key 'n'; allowed: budget_s, prompts_per_category, split, tokens"),
             ("ngram_ablation", {"categories": ["code"]}, "unknown key 'categories'"))
    for stage, table, message in cases:
        with pytest.raises(SplitInferError, match=re.escape(message)):
            get_stage(stage).config.from_table(table, "s")
    ok = {"head_depths": [2, 8], "paired_k": [0, 100], "rtt_ms": [0, 20.5], "time_budget_s": 60}
    assert get_stage("defenses").config.from_table({k: ok[k] for k in ("head_depths", "paired_k")}, "s")
    assert get_stage("speed").config.from_table({"rtt_ms": ok["rtt_ms"]}, "s").rtt_ms == [0, 20.5]
    with pytest.raises(SplitInferError, match=r"has type 'list\[bool\]'; use one of list, dict.* or list\[T\]"):
        stage_config("my_stage", "flags:list[bool]")


def test_suite_top_keys_refuse_an_unknown_dtype_and_a_negative_seed(tmp_path):
    for extra, message in (('dtype = "fp64"', "unknown dtype 'fp64'; choose one of fp32, bf16, fp16"),
                           ("seed = -1", "seed must be >= 0, got -1")):
        path = tmp_path / "s.toml"
        path.write_text(f'name = "x"\nmodel = "tiny-random"\n{extra}\n')
        with pytest.raises(SplitInferError, match=re.escape(f"{path}: {message}")):
            load_suite(str(path))


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
