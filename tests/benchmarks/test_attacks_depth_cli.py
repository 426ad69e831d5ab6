import pytest

from benchmarks.attacks_depth_cli import attack_hparams, hparams_json_items
from splitinfer.cli import build_parser
from splitinfer.errors import SplitInferError


def test_attack_options_update_the_study_defaults_per_attack(capsys):
    args = build_parser().parse_args(["bench", "attacks", "--hparams", '{"mlp": {"epochs": 20}}',
                                      "--attack-option", "linear-probe.lr=0.01", "--corpora", "prose,pii",
                                      "--head-depths", "1,8"])
    err = capsys.readouterr().err
    assert "--hparams is deprecated" in err and "--corpora is deprecated; use --corpus" in err
    assert args.corpus == ("prose", "pii") and args.head_depths == (1, 8)
    hp = attack_hparams({"mlp": {"epochs": 3, "width": 64}}, args.attack_option)
    assert hp == {"mlp": {"epochs": 20, "width": 64}, "linear-probe": {"lr": 0.01}}
    with pytest.raises(SplitInferError, match="needs the attack in each --attack-option: NAME.KEY=VALUE"):
        attack_hparams({}, ["epochs=3"])
    with pytest.raises(ValueError, match="not a JSON object of objects"):
        hparams_json_items("[1, 2]")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "attacks", "--hparams", "{oops"])
    assert len(capsys.readouterr().err.strip().splitlines()) == 2  # the warning, then the one-line error


def test_a_bad_attack_name_or_device_fails_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import benchmarks.attacks_depth as study
    from splitinfer.cli import main

    monkeypatch.setattr(study, "run_study", lambda *a, **k: pytest.fail("the study ran"))  # nothing may load
    for argv, needle in ((["--attacks", "linear-probe,bogus"], "unknown attack 'bogus'"),
                         (["--device", "tpu"], "unknown --device 'tpu'")):
        assert main(["bench", "attacks", "--model", "tiny-random", "--out", str(tmp_path), *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0]
