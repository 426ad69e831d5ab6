"""The new-defenses study's command line (the study itself runs the defenses stage, tested beside it)."""

from __future__ import annotations

import pytest

from benchmarks import defenses_new_study


def test_a_missing_or_bad_suite_is_one_line_before_the_model_loads(tmp_path, capsys):
    # a missing suite file was a SplitInferError traceback
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\nmodel = "tiny-random"\n[defenses]\noptions = { "mlp" = { lr = "fast" } }\n')
    for suite, message in ((str(tmp_path / "missing.toml"), "no suite"), (str(bad), "mlp lr='fast' must be")):
        with pytest.raises(SystemExit) as e:
            defenses_new_study.main(["--suite", suite, "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and message in err[-1] and not any("Traceback" in line for line in err)
    assert not (tmp_path / "o").exists()
