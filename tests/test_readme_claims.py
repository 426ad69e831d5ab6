"""Every claim of the README's "What the committed reports show" section is backed by the reports it names.

Keyed claims (issue 28, finding 9): a bullet states its figures in HTML comments keyed to (report, row,
metric) (:mod:`benchmarks.claims` gives the format); each is compared with that row's value, interval and count,
and the figures it states must appear in the bullet's prose. Figures no claim comment covers are still held to
the weaker check below.

The README is where users read the suite's figures, so a figure that is not in the committed report it cites is
a wrong number in public (issue 14, finding 12: tau 2.18 where the report said 2.22, a float32 floor no report
showed). For every bullet of that section this test checks that

- it names at least one committed report (a backticked ``reports/...`` path), and every path it names exists;
- every decimal figure it states (``92.8``, ``2.37``, ``0.960``, ``[98.2, 100.0]``) occurs, written the same
  way, in the text of the reports it names (Markdown, plain text and JSON files under a named directory).

Whole numbers are not checked (depths, counts, "100%": they occur everywhere and prove nothing).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.claims import check_claim, parse_claims, strip_claims, unshown_figures

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## What the committed reports show"
REPORT_PATH = re.compile(r"`(reports/[^`\s]+)`")
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?!\w)")
TEXT_SUFFIXES = (".md", ".txt", ".json")


def claim_bullets(readme: str) -> list[str]:
    """The top-level bullets of the README's claims section, each as one string."""
    if SECTION not in readme:
        raise AssertionError(f"the README has no '{SECTION}' section")
    body = readme.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.split(r"\n- ", "\n" + body)[1:]]


def report_text(path: Path) -> str:
    """The text of one committed report: a file, or every text file under a directory."""
    files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.suffix in TEXT_SUFFIXES)
    return "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)


def unbacked_figures(bullet: str, root: Path = ROOT) -> tuple[list[str], list[str]]:
    """(report paths named but missing, decimal figures not found in the named reports) of one bullet."""
    keyed = {f for c in parse_claims(bullet) for f in (c.shown.value, c.shown.low, c.shown.high) if f}
    bullet = strip_claims(bullet)
    paths = [p.rstrip(".,;:") for p in REPORT_PATH.findall(bullet)]
    missing = [p for p in paths if not (root / p).exists()]
    shown = set(DECIMAL.findall("\n".join(report_text(root / p) for p in paths if (root / p).exists())))
    return missing, [n for n in DECIMAL.findall(bullet) if n not in shown and n not in keyed]  # 8.0 is not 38.0


BULLETS = claim_bullets((ROOT / "README.md").read_text(encoding="utf-8"))
KEYED = [(c, b) for b in BULLETS for c in parse_claims(b)]


def test_the_claims_section_has_claims():
    assert len(BULLETS) >= 5


@pytest.mark.parametrize("bullet", BULLETS, ids=[re.sub(r"\W+", "-", b[:40]).strip("-") for b in BULLETS])
def test_each_claim_names_existing_reports_that_show_its_figures(bullet):
    assert REPORT_PATH.search(bullet), f"claim names no committed report: {bullet[:80]!r}"
    missing, unbacked = unbacked_figures(bullet)
    assert not missing, f"claim names reports that do not exist: {missing}"
    assert not unbacked, f"figures not in the reports the claim names: {unbacked} in {bullet[:80]!r}"


def test_a_figure_missing_from_its_report_is_caught(tmp_path):
    (tmp_path / "reports" / "r").mkdir(parents=True)
    (tmp_path / "reports" / "r" / "report.md").write_text("tau 2.22 over 20 prompts\n", encoding="utf-8")
    assert unbacked_figures("tau 2.22 (`reports/r/`)", tmp_path) == ([], [])
    assert unbacked_figures("tau 2.18 (`reports/r/`)", tmp_path) == ([], ["2.18"])
    assert unbacked_figures("tau 2.22 (`reports/gone/`)", tmp_path) == (["reports/gone/"], ["2.22"])
    assert unbacked_figures("tau 2.2 (`reports/r/`)", tmp_path) == ([], ["2.2"])  # a figure, not a substring


def test_claims_are_keyed_to_rows():
    assert len(KEYED) >= 40


@pytest.mark.parametrize("claim, bullet", KEYED, ids=[f"{c.report}:{c.row}:{c.metric}" for c, _ in KEYED])
def test_each_keyed_claim_matches_its_row_and_is_in_the_prose(claim, bullet):
    assert check_claim(claim, ROOT) == []
    assert unshown_figures(claim, strip_claims(bullet)) == [], f"the prose does not state {claim.text}"


def test_a_keyed_figure_is_not_also_checked_loosely(tmp_path):
    (tmp_path / "reports" / "r").mkdir(parents=True)
    (tmp_path / "reports" / "r" / "report.md").write_text("tau 2.22\n", encoding="utf-8")
    bullet = "tau 2.22, 9.75 (`reports/r/`) <!-- claim: reports/x.json | a | b | 9.75 -->"
    assert unbacked_figures(bullet, tmp_path) == ([], [])
    assert unbacked_figures("tau 2.22, 9.75 (`reports/r/`)", tmp_path) == ([], ["9.75"])


def test_the_readme_claims_fail_when_mutated():
    """The three mutations of issue 28 (finding 9) on the README's own claims: a figure swapped between depths,
    a point outside its interval, a wrong count."""
    from dataclasses import replace

    by_row = {(c.report, c.row, c.metric): c for c, _ in KEYED}
    h2 = by_row[("reports/quick/results.json", "attacks/linear-probe/head:2", "token_acc_top1")]
    h8 = by_row[("reports/attacks_depth/attacks_depth.json", "attacks/linear-probe/head:8", "token_acc_top1")]
    assert check_claim(replace(h2, shown=h8.shown), ROOT) != []  # the depth-8 figure written against depth 2
    ranged = next(c for c, _ in KEYED if c.shown.low is not None and c.shown.value != c.shown.high)
    outside = replace(ranged, shown=replace(ranged.shown, value=f"{float(ranged.shown.low) - 5:.1f}"))
    assert any("outside its interval" in p for p in check_claim(outside, ROOT))
    counted = next(c for c, _ in KEYED if c.shown.n is not None)
    assert any("count" in p for p in check_claim(replace(counted, shown=replace(counted.shown, n=counted.shown.n + 1)),
                                                 ROOT))
