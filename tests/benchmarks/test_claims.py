"""README claims keyed to (report, row, metric): the mutations issue 28 (finding 9) says the old test let pass."""

from __future__ import annotations

import json

import pytest

from benchmarks.claims import ClaimError, check_claim, parse_claims, parse_shown, strip_claims, unshown_figures

RESULTS = {"schema_version": 1, "results": {
    "defenses/head:2/none": {"recovery_top1": {"value": 1.0, "ci_low": 0.944, "ci_high": 1.0, "n": 64}},
    "defenses/head:8/noise": {"recovery_top1": {"value": 0.844, "ci_low": 0.812, "ci_high": 0.875, "n": 64}},
    "side/sessions": {"depth_id_sequence_acc": {"value": 1.0, "ci_low": None, "ci_high": None, "n": 50}},
}}
TABLE = """# r

| depth | defense | recovery top-1 [CI] | next-token agreement |
|---|---|---|---|
| 2 | `none` | 100.0 [94.4, 100.0] n=64 | 100.0 |
| 8 | `noise(sigma=0.005)` | 84.4 [81.2, 87.5] n=64 | 55.8 |
| 2 | `noise(sigma=0.005)` | 100.0 [94.4, 100.0] n=64 | 75.9 |
"""


@pytest.fixture()
def root(tmp_path):
    (tmp_path / "reports" / "r").mkdir(parents=True)
    (tmp_path / "reports" / "r" / "results.json").write_text(json.dumps(RESULTS), encoding="utf-8")
    (tmp_path / "reports" / "r" / "report.md").write_text(TABLE, encoding="utf-8")
    return tmp_path


def one(text):
    (claim,) = parse_claims(text)
    return claim


def test_a_right_claim_holds(root):
    for text in ("<!-- claim: reports/r/results.json | defenses/head:8/noise | recovery_top1 | 84.4% [81.2, 87.5] n=64 -->",
                 "<!-- claim: reports/r/report.md | 8 & noise(sigma=0.005) | recovery top-1 [CI] | 84.4 [81.2, 87.5] n=64 -->",
                 "<!-- claim: reports/r/report.md | 2 & `noise(sigma=0.005)` | next-token agreement | 75.9 -->",
                 "<!-- claim: reports/r/results.json | side/sessions | depth_id_sequence_acc | 100% n=50 -->"):
        assert check_claim(one(text), root) == [], text


@pytest.mark.parametrize("report", ["results.json", "report.md"])
def test_a_figure_swapped_between_rows_fails(root, report):
    """Head 2's noise figure written against head 8's row (the old test found 84.4 somewhere in the file)."""
    row = "defenses/head:2/none" if report.endswith("json") else "2 & none"
    metric = "recovery_top1" if report.endswith("json") else "recovery top-1 [CI]"
    problems = check_claim(one(f"<!-- claim: reports/r/{report} | {row} | {metric} | 84.4% [81.2, 87.5] -->"), root)
    assert any("the README says 84.4" in p for p in problems) and any("interval" in p for p in problems)


def test_a_point_outside_its_interval_fails(root):
    claim = one("<!-- claim: reports/r/results.json | defenses/head:8/noise | recovery_top1 | 88.4% [81.2, 87.5] -->")
    problems = check_claim(claim, root)
    assert any("outside its interval" in p for p in problems)


def test_a_wrong_count_fails(root):
    claim = one("<!-- claim: reports/r/results.json | side/sessions | depth_id_sequence_acc | 100% n=20 -->")
    assert check_claim(claim, root) == ["reports/r/results.json [side/sessions] depth_id_sequence_acc: the README's "
                                        "count n=20 is not the report's n=50"]
    claim = one("<!-- claim: reports/r/report.md | 8 & noise(sigma=0.005) | recovery top-1 [CI] | 84.4 n=16 -->")
    assert any("n=16" in p for p in check_claim(claim, root))


def test_a_claim_in_a_table_cell_escapes_its_separators(root):
    """In a Markdown table row the separators are written '\\|' (a bare '|' would end the cell); same claim."""
    fields = ["reports/r/results.json", "defenses/head:8/noise", "recovery_top1", "84.4% [81.2, 87.5] n=64"]
    plain = one("<!-- claim: " + " | ".join(fields) + " -->")
    cell = one("<!-- claim: " + r" \| ".join(fields) + " -->")
    assert (cell.report, cell.row, cell.metric, cell.shown) == (plain.report, plain.row, plain.metric, plain.shown)
    assert check_claim(cell, root) == []


def test_a_missing_row_metric_or_report_fails(root):
    assert "not a run" in check_claim(one("<!-- claim: reports/r/results.json | x | recovery_top1 | 1 -->"), root)[0]
    assert "not in row" in check_claim(
        one("<!-- claim: reports/r/results.json | defenses/head:2/none | tau | 1 -->"), root)[0]
    assert "0 table rows" in check_claim(one("<!-- claim: reports/r/report.md | 4 & none | x | 1 -->"), root)[0]
    assert "2 table rows" in check_claim(
        one("<!-- claim: reports/r/report.md | 2 | next-token agreement | 1 -->"), root)[0]  # ambiguous key
    assert check_claim(one("<!-- claim: reports/gone.json | a | b | 1 -->"), root) == ["reports/gone.json does not exist"]


def test_decimals_are_compared_as_written(root):
    assert check_claim(one("<!-- claim: reports/r/results.json | defenses/head:8/noise | recovery_top1 | 84% -->"),
                       root) == []
    assert check_claim(one("<!-- claim: reports/r/results.json | defenses/head:8/noise | recovery_top1 | 84.5% -->"),
                       root) != []
    assert check_claim(one("<!-- claim: reports/r/results.json | defenses/head:8/noise | recovery_top1 | 0.844 -->"),
                       root) == []  # no %: the stored fraction


def test_the_prose_must_state_the_claimed_figures():
    claim = one("<!-- claim: r.json | a | m | 84.4% [81.2, 87.5] n=3186 -->")
    assert unshown_figures(claim, "recovers 84.4% [81.2, 87.5] of 3,186 tokens") == []
    assert unshown_figures(claim, "recovers 84.4% [81.2, 87.6] of 3186 tokens") == ["[81.2, 87.5]"]
    assert unshown_figures(claim, "recovers 184.4% [81.2, 87.5] of 318 tokens") == ["84.4", "3186"]
    assert unshown_figures(claim, "recovers 84.4% [81.2,\n  87.5] of 3186") == []  # an interval across lines
    assert unshown_figures(one("<!-- claim: r.json | a | m | 3.39 -->"), "(3.39x; 16 sessions)") == []
    text = "a 84.4 b <!-- claim: r.json | a | m | 84.4 -->"
    assert "claim" not in strip_claims(text) and "84.4" in strip_claims(text)


@pytest.mark.parametrize("bad", ["<!-- claim: a | b | c -->", "<!-- claim: a | b | c | about 80 -->",
                                 "<!-- claim: a | | c | 80 -->"])
def test_a_malformed_claim_is_a_one_line_error(bad):
    with pytest.raises(ClaimError, match="claim"):
        parse_claims(bad)
    assert parse_shown("3,186").value == "3,186"


def test_a_claim_can_quote_a_report_as_committed_at_an_older_commit(root):
    """A "before" figure stays checkable after a later run replaces its report: ``path@COMMIT`` reads the file
    with ``git show``; a commit the clone lacks is a one-line problem naming the fix."""
    import subprocess

    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "reports"], check=True)
    subprocess.run(git + ["commit", "-qm", "before"], check=True)
    before = subprocess.run(git[:3] + ["rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    newer = json.loads(json.dumps(RESULTS))
    newer["results"]["defenses/head:8/noise"]["recovery_top1"].update(value=0.5, ci_low=0.4, ci_high=0.6)
    (root / "reports" / "r" / "results.json").write_text(json.dumps(newer), encoding="utf-8")
    old = f"<!-- claim: reports/r/results.json@{before} | defenses/head:8/noise | recovery_top1 | 84.4% [81.2, 87.5] -->"
    assert check_claim(one(old), root) == []
    assert check_claim(one(old.replace(f"@{before}", "")), root) != []  # the tree holds the newer run
    assert check_claim(one(old.replace("84.4% [81.2, 87.5]", "50.0% [40.0, 60.0]")), root) != []  # the newer figure
    (problem,) = check_claim(one(old.replace(before, "0000000")), root)
    assert "not in this checkout's history" in problem and "\n" not in problem
