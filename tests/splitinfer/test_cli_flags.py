import argparse

import pytest

from splitinfer.cli import main
from splitinfer.cli_flags import (
    LinkFlags,
    ModelFlags,
    OneLineParser,
    add_deprecated,
    add_link_args,
    add_model_args,
    finite_float,
    float_list,
    option_value,
    parse_options,
    split_options,
    wire_list,
)
from splitinfer.errors import SplitInferError


def test_option_values_are_json_scalars_else_text():
    assert [option_value(v) for v in ("3", "0.5", "true", "False", "off", "a,b", "null")] == \
        [3, 0.5, True, False, "off", "a,b", None]
    opts = parse_options(["epochs=3", "feature-draft.short-list=false", "draft-budget=8"], "--x-option")
    assert opts == {"epochs": 3, "feature-draft.short_list": False, "draft_budget": 8}
    assert split_options(opts) == ({"epochs": 3, "draft_budget": 8}, {"feature-draft": {"short_list": False}})
    with pytest.raises(SplitInferError, match=r"bad --x-option 'epochs': write KEY=VALUE, e.g. --x-option a=1"):
        parse_options(["epochs"], "--x-option", "a=1")


def test_list_flags_fail_in_one_line(capsys):
    assert float_list("0, 20,80") == (0.0, 20.0, 80.0)
    assert wire_list("fp32,fp16") == ("fp32", "fp16")
    for bad, parse in (("0,x", float_list), ("", float_list), ("fp8", wire_list)):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)
    with pytest.raises(SystemExit) as e:
        main(["bench", "speed", "--rtt-ms", "0,x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1
    assert err[0].startswith("splitinfer bench speed: error: argument --rtt-ms: '0,x' is not a comma list")


def test_deprecated_aliases_warn_and_store_like_the_new_flag(capsys):
    p = OneLineParser(prog="t")
    p.add_argument("--attack-option", action="append", default=[])
    add_deprecated(p, "--hparam", "--attack-option", "attack_option", append=True)
    p.add_argument("--subset", default=None)
    add_deprecated(p, "--split", "--subset", "subset", choices=["train", "test"])
    p.add_argument("--count-tokens", action="store_true")
    add_deprecated(p, "--tokens", "--count-tokens", "count_tokens", flag=True)
    args = p.parse_args(["--hparam", "a=1", "--attack-option", "b=2", "--split", "test", "--tokens"])
    assert args.attack_option == ["a=1", "b=2"] and args.subset == "test" and args.count_tokens
    err = capsys.readouterr().err
    assert "t: warning: --hparam is deprecated; use --attack-option" in err and "--split is deprecated" in err
    assert p.parse_args([]).attack_option == []  # the default list was not mutated by the alias
    with pytest.raises(SystemExit):
        p.parse_args(["--split", "nope"])


def test_flags_become_frozen_configs():
    p = argparse.ArgumentParser()
    add_model_args(p)
    add_link_args(p)
    args = p.parse_args(["--model", "tiny-random", "--rtt-ms", "20", "--seed", "3"])
    model, link = ModelFlags.from_args(args), LinkFlags.from_args(args)
    assert model == ModelFlags(model="tiny-random", seed=3) and link == LinkFlags(rtt_ms=20.0)
    with pytest.raises(Exception):
        model.seed = 4  # frozen
    assert link.wan(seed=3).rtt_ms == 20.0
    with pytest.raises(SplitInferError, match="--rtt-ms takes one value here, got 20.0,80.0"):
        LinkFlags.from_args(p.parse_args(["--rtt-ms", "20,80"]))


def test_generate_refuses_a_list_of_rtts_in_one_line(capsys):
    assert main(["generate", "--model", "tiny-random", "--rtt-ms", "20,80", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--rtt-ms takes one value here" in err[0]


def test_schema_errors_end_in_one_line(tmp_path, capsys):
    bad = tmp_path / "r.json"
    bad.write_text('{"schema_version": 1}')
    assert main(["bench", "report", "--results", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("splitinfer: error:") and "is missing" in err[0]


@pytest.mark.parametrize("argv, message", [
    (["generate", "--model", "tiny-random", "--temperature", "nan", "hi"],
     "argument --temperature: 'nan' is not a finite"),
    (["generate", "--model", "tiny-random", "--rtt-ms", "inf", "hi"], "argument --rtt-ms: 'inf' is not a comma list"),
    (["generate", "--model", "tiny-random", "--bandwidth-mbps", "nan", "hi"], "'nan' is not a finite number"),
    (["serve", "--max-frame-mb", "nan"], "argument --max-frame-mb: 'nan' is not a finite number"),
    (["bench", "speed", "--max-new-tokens", "0"], "argument --max-new-tokens: 0 must be >= 1"),
    (["bench", "extract", "--threads", "0"], "argument --threads: 0 must be >= 1"),
    # --gen-batch 0 and --sessions 0 raised a traceback (range step 0, an empty list indexed); --depths 0 was
    # refused only once the model had loaded
    (["draft-train", "--model", "tiny-random", "--gen-batch", "0"], "argument --gen-batch: 0 must be >= 1"),
    (["bench", "transport", "--sessions", "0"], "argument --sessions: 0 must be >= 1"),
    (["bench", "transport", "--repeats", "0"], "argument --repeats: 0 must be >= 1"),
    (["bench", "transport", "--synthetic-hidden", "576,-1"], "argument --synthetic-hidden: -1 must be >= 1"),
    (["bench", "extract", "--depths", "0,8"], "argument --depths: 0 must be >= 1"),
    (["chat", "--model", "tiny-random", "--max-new-tokens", "0"], "argument --max-new-tokens: 0 must be >= 1"),
])
def test_nan_infinite_and_zero_flags_are_refused_before_anything_runs(argv, message, capsys):
    assert finite_float("1e3") == 1000.0
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and message in err[0]


@pytest.mark.parametrize("argv, message", [
    (["generate", "--model", "tiny-random", "--device", "tpu", "hi"], "unknown --device 'tpu'"),
    (["generate", "--model", "tiny-random", "--device", "cuda:abc", "hi"], "unknown --device 'cuda:abc'"),
    (["bench", "exactness", "--model", "tiny-random", "--prompts", "9"], "--prompts 9: there are 8 built-in prompts"),
])
def test_bad_devices_and_counts_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("splitinfer: error:") and message in err[0]


def test_a_damaged_model_file_is_one_line(tmp_path, capsys):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    assert main(["generate", "--model", str(junk), "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"splitinfer: error: cannot load model '{junk}'")
