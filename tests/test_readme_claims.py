"""Every claim of the "What the committed reports show" sections (README.md and docs/findings.md) is backed by
the reports it names.

Keyed claims: a bullet or table row states its figures in HTML comments keyed to (report,
row, metric) (:mod:`benchmarks.claims` gives the format); each is compared with that row's value, interval and
count, and the figures it states must appear in the bullet's or row's prose. Figures no claim comment covers are
still held to the weaker check below.

The sections checked are "What the committed reports show" and, in docs/findings.md, "What changed when the
defense-scoring rules changed" (its "before" figures are keyed to reports as committed then: ``path@COMMIT``).
Every claim comment of those sections must sit inside an item (a claim outside every item is checked by
nothing).

The README is where users read the suite's figures, so a figure that is not in the committed report it cites is
a wrong number in public (issue 14, finding 12: tau 2.18 where the report said 2.22, a float32 floor no report
showed). For every item of those sections (a top-level bullet, or a body row of a Markdown table) this test
checks that

- it names at least one committed report (a backticked ``reports/...`` path), and every path it names exists;
- every decimal figure it states (``92.8``, ``2.37``, ``0.960``, ``[98.2, 100.0]``) occurs, written the same
  way, in the text of the reports it names (Markdown, plain text and JSON files under a named directory).

Whole numbers are not checked (depths, counts, "100%": they occur everywhere and prove nothing).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.claims import check_claim, parse_claims, report_text, strip_claims, unshown_figures

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## What the committed reports show"
SECTIONS = (SECTION, "## What changed when the defense-scoring rules changed")  # the first is required
CLAIM_FILES = ("README.md", "docs/findings.md")  # the README's table and the findings it moved to docs/
REPORT_PATH = re.compile(r"`(reports/[^`\s]+)`")
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?!\w)")
TABLE_RULE = re.compile(r"\|(\s*:?-+:?\s*\|)+")
TEXT_SUFFIXES = (".md", ".txt", ".json")


def table_rows(lines: list[str]) -> list[str]:
    """The body rows of every Markdown table in ``lines`` (not the header, not the rule under it)."""
    rows, in_body = [], False
    for line in lines:
        if not line.startswith("|"):
            in_body = False
        elif TABLE_RULE.fullmatch(line.strip()):
            in_body = True
        elif in_body:
            rows.append(line.strip())
    return rows


def claim_sections(text: str) -> list[str]:
    """The text of each claims section of a file (:data:`SECTIONS`, up to the next ``## `` heading)."""
    if SECTION not in text:
        raise AssertionError(f"no '{SECTION}' section")
    return [text.split(name, 1)[1].split("\n## ", 1)[0] for name in SECTIONS if name in text]


def claim_items(text: str) -> list[str]:
    """The items of a file's claims sections, each as one string: per section its table body rows, then its
    top-level bullets."""
    items = []
    for section in claim_sections(text):
        lines = section.splitlines()
        prose = "\n".join(line for line in lines if not line.startswith("|"))
        items += table_rows(lines) + [b.strip() for b in re.split(r"\n- ", "\n" + prose)[1:]]
    return items


def named_report_text(root: Path, name: str) -> str | None:
    """The text of one named report (None if it does not exist): a file, every text file under a directory, or
    ``path@COMMIT``, a file as committed then."""
    if "@" in name:
        return report_text(root, name)[0]
    path = root / name
    if not path.exists():
        return None
    files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.suffix in TEXT_SUFFIXES)
    return "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)


def unbacked_figures(bullet: str, root: Path = ROOT) -> tuple[list[str], list[str]]:
    """(report paths named but missing, decimal figures not found in the named reports) of one bullet."""
    keyed = {f for c in parse_claims(bullet) for f in (c.shown.value, c.shown.low, c.shown.high) if f}
    bullet = strip_claims(bullet)
    texts = {p: named_report_text(root, p) for p in (p.rstrip(".,;:") for p in REPORT_PATH.findall(bullet))}
    missing = [p for p, t in texts.items() if t is None]
    shown = set(DECIMAL.findall("\n".join(t for t in texts.values() if t is not None)))
    return missing, [n for n in DECIMAL.findall(bullet) if n not in shown and n not in keyed]  # 8.0 is not 38.0


ITEMS = {name: claim_items((ROOT / name).read_text(encoding="utf-8")) for name in CLAIM_FILES}
BULLETS = [(name, item) for name in CLAIM_FILES for item in ITEMS[name]]
KEYED = [(c, b) for _, b in BULLETS for c in parse_claims(b)]
README_ROWS = table_rows((ROOT / "README.md").read_text(encoding="utf-8").split(SECTION, 1)[1]
                         .split("\n## ", 1)[0].splitlines())


@pytest.mark.parametrize("name", CLAIM_FILES)
def test_the_claims_section_has_claims(name):
    assert len(ITEMS[name]) >= 5


def test_the_readme_leads_with_one_keyed_table():
    """The README's findings open with one table of 8-12 headline rows, each keyed to a report row."""
    assert 8 <= len(README_ROWS) <= 12
    assert all(parse_claims(row) for row in README_ROWS), [r[:60] for r in README_ROWS if not parse_claims(r)]


def test_table_rows_are_items_and_their_escaped_claims_parse():
    text = ("intro\n\n" + SECTION + "\n\n| finding | figure | report |\n|---|---|---|\n"
            "| tau | 2.22 | `reports/r/` <!-- claim: reports/r/results.json \\| a/b \\| tau \\| 2.22 --> |\n\n"
            "- a bullet (`reports/r/`)\n  more\n\n## Next\n\n- not an item\n")
    items = claim_items(text)
    assert [i[:5] for i in items] == ["| tau", "a bul"]
    (claim,) = parse_claims(items[0])
    assert (claim.report, claim.row, claim.metric, claim.shown.value) == \
        ("reports/r/results.json", "a/b", "tau", "2.22")
    assert "claim" not in strip_claims(items[0])


def _item_id(name: str, item: str) -> str:
    return name + ":" + re.sub(r"\W+", "-", item[:40]).strip("-")


@pytest.mark.parametrize("name, bullet", BULLETS, ids=[_item_id(n, b) for n, b in BULLETS])
def test_each_claim_names_existing_reports_that_show_its_figures(name, bullet):
    assert REPORT_PATH.search(bullet), f"claim in {name} names no committed report: {bullet[:80]!r}"
    if "@" in "".join(REPORT_PATH.findall(bullet)) and not full_history():
        pytest.skip("the item names a report at an older commit: needs the git history (this checkout is shallow)")
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


@pytest.mark.parametrize("name", CLAIM_FILES)
def test_every_claim_comment_sits_in_an_item(name):
    """A claim comment between items (under a table, before the first bullet) would be checked by nothing."""
    text = (ROOT / name).read_text(encoding="utf-8")
    in_sections = sum(len(parse_claims(s)) for s in claim_sections(text))
    assert sum(len(parse_claims(item)) for item in ITEMS[name]) == in_sections


def test_a_claim_under_a_table_is_not_in_any_item():
    text = (SECTION + "\n\n| a | b |\n|---|---|\n| x | 1.5 (`reports/r/`) |\n"
            "  <!-- claim: reports/r/results.json | a | b | 1.5 -->\n")
    assert sum(len(parse_claims(i)) for i in claim_items(text)) == 0
    assert len(parse_claims(claim_sections(text)[0])) == 1


def full_history() -> bool:
    """Whether this checkout has its whole git history (a shallow clone or an unpacked archive has not)."""
    import subprocess

    try:
        done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"], capture_output=True,
                              text=True)
    except OSError:
        return False
    return done.returncode == 0 and done.stdout.strip() == "false"


@pytest.mark.parametrize("claim, bullet", KEYED, ids=[f"{c.report}:{c.row}:{c.metric}" for c, _ in KEYED])
def test_each_keyed_claim_matches_its_row_and_is_in_the_prose(claim, bullet):
    if "@" in claim.report and not full_history():
        pytest.skip(f"{claim.report} needs the git history (this checkout is shallow or not a clone)")
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
