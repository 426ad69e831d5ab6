"""--defense / --defense-option on generate: recorded in the JSON summary; bad specs are one-line errors."""

import json

from splitinfer.cli import main


def test_generate_records_the_defense(capsys):
    argv = ["generate", "--model", "tiny-random", "--split", "2,1", "--max-new-tokens", "3", "--json",
            "--defense", "noise+quant", "--defense-option", "noise.sigma=0.2", "--defense-option", "quant.format=fp8",
            "Hello"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["defense"] == "noise(sigma=0.2,clip=8.0)+quant(format=fp8)"
    assert "per released vector" in summary["defense_detail"][0]
    assert "seed" not in json.dumps(summary)  # the drawn secret seed is not in the shareable summary


def test_bad_defense_flags_are_one_line_errors(capsys):
    for extra, msg in ((["--defense", "blur"], "unknown defense 'blur'"),
                       (["--defense", "noise", "--defense-option", "sigma=x"], "must be a finite number"),
                       (["--defense", "quant", "--defense-option", "format=int2"], "choose one of int8, fp8, int4")):
        assert main(["generate", "--model", "tiny-random", *extra, "hi"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("splitinfer: error:") and msg in err[0]


def test_generate_json_never_shows_a_drawn_secret_seed(capsys):
    """``defense_detail`` (each defense's ``describe()``) is in the shareable summary too: the seeds generate drew
    for lora-random and permute must not appear there either."""
    for spec in ("lora-random(rank=2)", "permute"):
        argv = ["generate", "--model", "tiny-random", "--split", "2,1", "--max-new-tokens", "2", "--json",
                "--defense", spec, "Hello"]
        assert main(argv) == 0
        out = capsys.readouterr().out.strip().splitlines()[-1]
        assert "seed" not in out, out
