"""The resend sweep: recovery against the sessions a text was sent in, on the tiny model."""

from __future__ import annotations

import json

import pytest

from benchmarks import resend_sweep

SUITE = """
name = "tiny-resend"
description = "the resend sweep on the tiny model"
model = "tiny-random"
seed = 0
[defenses]
head_depths = [2]
defenses = ["none"]
attackers = ["session-average"]
corpora = ["prose"]
train_tokens = 600
test_tokens = 400
max_length = 32
options = { "session-average" = { proposer_tokens = 500, random_tokens = 128, max_candidates = 32, batch_sizes = [32], repeats = 4 } }
"""


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("resend")
    (root / "suite.toml").write_text(SUITE)
    out = root / "out"
    assert resend_sweep.main(["--suite", str(root / "suite.toml"), "--repeats", "1,4", "--out", str(out),
                              "--specs", "noise(sigma=0.3)", "noise(sigma=0.3,per_session=false)"]) == 0
    return out, json.loads((out / "results.json").read_text())


def test_each_spec_and_r_is_a_row_with_its_predictions(swept):
    out, doc = swept
    rows = doc["data"]["rows"]
    assert [(r["per_session"], r["r"]) for r in rows] == [(True, 1), (True, 4), (False, 1), (False, 4)]
    assert rows[1]["effective_sigma"] == pytest.approx(0.15) and rows[3]["effective_sigma"] == pytest.approx(0.3)
    assert all(r["scored_set"]["tokens"] == r["top1"]["n"] > 0 for r in rows)
    assert [r["fitted_on_sessions"] for r in rows] == [1, 4, 1, 4]  # each r's attacker fitted on r-session means
    assert len(list((out / "predictions").rglob("*.jsonl*"))) == 4
    assert (out / "recovery_vs_sessions.png").stat().st_size > 0
    assert "| 2 | `noise(sigma=0.3," in (out / "report.md").read_text()


def test_draws_keyed_by_the_text_leave_nothing_to_average(swept):
    rows = swept[1]["data"]["rows"]
    same = [r for r in rows if not r["per_session"]]
    assert same[1]["top1"]["value"] == same[0]["top1"]["value"]
    assert same[1]["gain_over_r1"]["value"] == 0.0


def test_repeats_must_start_at_one_session(tmp_path, capsys):
    with pytest.raises(SystemExit):
        resend_sweep.main(["--specs", "noise(sigma=0.1)", "--repeats", "2,4", "--out", str(tmp_path)])
    assert "repeats that start at 1" in capsys.readouterr().err


def test_a_spec_without_wire_noise_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        resend_sweep.main(["--suite", "literature", "--specs", "quant(format=int8)", "--out", str(tmp_path)])
    assert "no wire noise to resend under" in capsys.readouterr().err


def test_a_missing_or_bad_suite_is_one_line_before_the_model_loads(tmp_path, capsys):
    # a missing suite file was a SplitInferError traceback
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\nmodel = "tiny-random"\n[defenses]\nattackers = ["nope"]\n')
    for suite, message in ((str(tmp_path / "missing.toml"), "no suite"), (str(bad), "unknown attack 'nope'")):
        with pytest.raises(SystemExit) as e:
            resend_sweep.main(["--suite", suite, "--specs", "noise(sigma=0.1)", "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and message in err[-1] and not any("Traceback" in line for line in err)


def test_attack_rescore_reproduces_every_row_from_its_predictions(swept):
    """The first committed run recorded its rows under other run names than its predictions carry, so `attack
    rescore` found none of them."""
    from attacks.predictions import rescore_dir

    checked = rescore_dir(swept[0])
    assert len(checked) == 4 and all(not c["missing"] and c["metrics"] and not c["mismatches"] for c in checked)



def test_replot_redraws_a_finished_sweep_without_running_it(swept, tmp_path, capsys):
    out = swept[0]
    plot = out / "recovery_vs_sessions.png"
    plot.unlink()
    assert resend_sweep.main(["--replot", str(out)]) == 0
    assert plot.stat().st_size > 0
    with pytest.raises(SystemExit):
        resend_sweep.main(["--replot", str(tmp_path)])
    err = capsys.readouterr().err
    assert "no resend-sweep results.json" in err and "Traceback" not in err


def test_running_needs_specs_and_an_output_directory(capsys):
    with pytest.raises(SystemExit):
        resend_sweep.main(["--specs", "noise(sigma=0.1)"])
    assert "give --specs and --out" in capsys.readouterr().err


@pytest.fixture(scope="module")
def parts(swept, tmp_path_factory):
    """The fixture's two specs swept one at a time, as a long sweep is run to survive a session's end."""
    root = swept[0].parent
    dirs = []
    for i, spec in enumerate(["noise(sigma=0.3)", "noise(sigma=0.3,per_session=false)"]):
        dirs.append(root / f"part-{i}")
        assert resend_sweep.main(["--suite", str(root / "suite.toml"), "--repeats", "1,4", "--out", str(dirs[-1]),
                                  "--specs", spec]) == 0
    return dirs


def test_sweeps_of_one_spec_each_merge_into_the_sweep_of_both(swept, parts, tmp_path):
    out = tmp_path / "joined"
    assert resend_sweep.main(["--merge", *map(str, parts), "--out", str(out)]) == 0
    joined, whole = json.loads((out / "results.json").read_text()), swept[1]
    assert [r["run"] for r in joined["data"]["rows"]] == [r["run"] for r in whole["data"]["rows"]]
    assert [r["top1"] for r in joined["data"]["rows"]] == [r["top1"] for r in whole["data"]["rows"]]
    assert joined["results"] == whole["results"]
    assert [m["dir"] for m in joined["data"]["merged_from"]] == list(map(str, parts))
    assert joined["git_hash"] == whole["git_hash"] and joined["data"]["device"] == "cpu"
    assert "the sum of 2 sweeps joined with --merge" in (out / "report.md").read_text()
    from attacks.predictions import rescore_dir

    checked = rescore_dir(out)
    assert len(checked) == 4 and all(not c["missing"] and c["metrics"] and not c["mismatches"] for c in checked)


def test_merge_refuses_parts_of_different_runs_in_one_line(swept, parts, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    doc = json.loads((parts[1] / "results.json").read_text())
    doc["data"]["repeats"] = [1, 2]
    (other / "results.json").write_text(json.dumps(doc))
    cases = [([parts[0], other], "has repeats [1, 2]"), ([parts[0], swept[0]], "is in both"),
             ([parts[0], tmp_path], "no resend-sweep results.json"), ([parts[0]], "at least two")]
    for dirs, why in cases:
        with pytest.raises(SystemExit):
            resend_sweep.main(["--merge", *map(str, dirs), "--out", str(tmp_path / "x")])
        err = capsys.readouterr().err
        assert why in err and "Traceback" not in err
    assert not (tmp_path / "x" / "results.json").exists()


def test_a_missing_gpu_is_a_one_line_error_before_the_model_loads(tmp_path, capsys):
    if __import__("torch").cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit):
        resend_sweep.main(["--specs", "noise(sigma=0.1)", "--device", "cuda", "--out", str(tmp_path)])
    assert "CUDA is not available" in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="no CUDA (the CPU sweep is the fixtures')")
def test_the_sweep_runs_on_a_gpu(swept, tmp_path):
    root, device = swept[0].parent, "cuda"
    out = tmp_path / device
    assert resend_sweep.main(["--suite", str(root / "suite.toml"), "--repeats", "1,4", "--out", str(out),
                              "--device", device, "--specs", "noise(sigma=0.3)"]) == 0
    rows = json.loads((out / "results.json").read_text())["data"]["rows"]
    assert [r["r"] for r in rows] == [1, 4] and all(r["scored_set"]["tokens"] > 0 for r in rows)
    assert json.loads((out / "results.json").read_text())["data"]["device"] == device
