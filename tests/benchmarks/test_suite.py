import pytest

from benchmarks.suite import SUITES_DIR, load_suite
from splitinfer.errors import SplitInferError


@pytest.mark.parametrize("name", sorted(p.stem for p in SUITES_DIR.glob("*.toml")))
def test_committed_suites_load(name):
    suite = load_suite(name)
    assert suite.name == name and suite.stages


def test_unknown_suite_lists_known():
    with pytest.raises(SplitInferError, match="known suites are .*quick"):
        load_suite("nope")


@pytest.mark.parametrize(
    "text, message",
    [
        ('name = "x"\nmodel = "tiny-random"\n[speed]\nrtt = [1]\n', "unknown key 'rtt'"),
        ('name = "x"\nmodel = "tiny-random"\n[sped]\n', r"unknown stage \[sped\]"),
        ('name = "x"\nmodel = "tiny-random"\n[speed]\ntokens = "many"\n', "tokens must be int"),
        ('model = "tiny-random"\n', "missing top-level key 'name'"),
        ('name = "x\n', "not valid TOML"),
        ('name = "../../escaped-suite"\nmodel = "tiny-random"\n', "must be a plain identifier"),  # issue 30
        ('name = "/tmp/x"\nmodel = "tiny-random"\n', "must be a plain identifier"),
        ('name = ""\nmodel = "tiny-random"\n', "must be a plain identifier"),
    ],
)
def test_bad_suite_files(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SplitInferError, match=message):
        load_suite(str(path))


def test_validate_refuses_a_name_that_leaves_reports(tmp_path):
    """Issue 30, finding 7: ``bench run --suite FILE`` wrote to reports/<name>, and ``bench validate`` said ok."""
    from splitinfer.cli import main

    path = tmp_path / "escape.toml"
    path.write_text('name = "../../escaped-suite"\nmodel = "tiny-random"\n[speed]\n')
    assert main(["bench", "validate", str(path)]) == 2


def test_the_timing_suite_keeps_the_full_grids_sizes():
    """full-defenses-timing times two jobs of the full grid to project its cost: every size but the rows must be
    full.toml's (it said "sizes unchanged" while its scored set was a tenth of the grid's)."""
    full, timing = load_suite("full").stage("defenses"), load_suite("full-defenses-timing").stage("defenses")
    rows = {"head_depths", "defenses", "overhead", "rows_elsewhere", "time_budget_s", "budget_s"}
    assert {k: v for k, v in timing.items() if k not in rows} == {k: v for k, v in full.items() if k not in rows}
    assert set(timing["defenses"]) <= set(full["defenses"])


def test_a_suite_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "latin.toml"
    path.write_bytes('name = "caf\u00e9"\nmodel = "tiny-random"\n'.encode("latin-1"))
    with pytest.raises(SplitInferError, match="is not UTF-8 text"):
        load_suite(str(path))


def test_validate_names_a_component_that_is_not_a_string(tmp_path, capsys):
    from splitinfer.cli import main

    path = tmp_path / "numbers.toml"
    path.write_text('name = "numbers"\nmodel = "tiny-random"\n[defenses]\ndefenses = [3, "noise"]\n')
    assert main(["bench", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "[defenses]: defenses must hold str values, got 3 in [3, 'noise']" in err and "Traceback" not in err


def test_validate_checks_attack_and_decoding_options_before_anything_loads(tmp_path):
    # an option typo or a bad value used to surface only when the stage built the attacker (after extraction)
    from benchmarks.suite_names import check_names

    path = tmp_path / "options.toml"
    path.write_text('name = "opts"\nmodel = "tiny-random"\n[defenses]\n'
                    'options = { "linear-probe" = { epoch = 2 }, "mlp" = { lr = "fast" }, "mlp-seed" = { epochs = 3 }, '
                    '"vocab-match" = { scored_tokens = 40 }, "nope" = { x = 1 } }\n'
                    'decoding_options = { combined = { draft_budget = 2.5 }, ngram-pool = { ngram = 3 } }\n'
                    '[attacks]\noptions = { "vocab-match" = { scored_tokens = 40, pii_tokens = 96 } }\n')
    lines = check_names(load_suite(str(path)))
    assert len(lines) == 5 and all(line.startswith(f"{path} [defenses] ") for line in lines), lines
    assert "options: attack 'linear-probe' has no hyper-parameter(s) ['epoch']; it takes" in lines[0]
    assert "options: mlp lr='fast' must be a finite number; e.g. lr=0.001 (--attack-option lr=0.001)" in lines[1]
    assert "options: attack 'vocab-match' has no hyper-parameter(s) ['scored_tokens']" in lines[2]  # attacks stage only
    assert "options: unknown attack 'nope'" in lines[3]
    assert "decoding_options: decoding 'combined': option draft_budget=2.5 must be an integer" in lines[4]
    assert check_names(load_suite("ci")) == []
