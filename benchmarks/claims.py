"""README claims keyed to (report, row, metric), checked against the committed reports (issue 28, finding 9).

A claim is an HTML comment inside the bullet or table row that states the figure (README.md and
docs/findings.md; invisible when rendered)::

    <!-- claim: reports/quick/results.json | attacks/seq-decoder/head:1 | token_acc_top1 | 92.8% [91.3, 94.3] n=3522 -->
    <!-- claim: reports/attacks_learned/report.md | 6 | top-1 % [95% CI] | 92.0 [91.7, 92.4] -->
    <!-- claim: reports/full_defenses/78da72b/merged/report.md | 8 & quant(format=int8) | next-token agreement | 94.2 -->

Fields, separated by ``|`` (inside a Markdown table cell, written ``\\|`` so that the comment stays in its cell,
as in the README's findings table)::

    | ... | `reports/quick/results.json` <!-- claim: reports/quick/results.json \\| attacks/... \\| ... --> |

1. **report**: a committed file. A ``.json`` file is a results document (``results[run][metric] =
   {value, ci_low, ci_high, n}``, DESIGN.md section 7); a ``.md`` or ``.txt`` file is read for its
   Markdown tables. ``path@COMMIT`` reads the file as committed at ``COMMIT`` (``git show``): a figure
   quoted from a report that a later run replaced, as a "before" column does.
2. **row**: in a results document, the run key; in a Markdown table, the leading cells of the row,
   separated by ``&`` (backticks ignored): ``2 & quant(format=int8)`` is the row whose first cell is
   ``2`` and second ``quant(format=int8)``. Exactly one row must match.
3. **metric**: the metric name in a results document; the column header in a table.
4. **shown**: the figure as the README writes it: ``VALUE`` then optionally ``%`` (the report stores a
   fraction, the README a percentage), ``[LOW, HIGH]`` and ``n=N``. Each figure is compared with the
   report's at the number of decimals written (``92.8%`` matches 0.92789).

:func:`check_claim` returns the problems of one claim (empty when it holds): the row or metric is
missing or ambiguous, a figure differs from the report's (a figure swapped between rows), the value lies
outside its own interval, or the count differs. :func:`unshown_figures` lists the claim's figures that
the bullet's prose does not state, so the comment and the prose cannot drift apart.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Claim", "Shown", "ClaimError", "parse_claims", "parse_shown", "check_claim", "unshown_figures",
           "strip_claims", "report_text"]

CLAIM = re.compile(r"<!--\s*claim:(.*?)-->", re.S)
_NUM = r"[+-]?\d[\d,]*(?:\.\d+)?"
_SHOWN = re.compile(rf"^\s*(?P<value>{_NUM})\s*(?P<pct>%)?\s*(?:\[\s*(?P<low>{_NUM})\s*,\s*(?P<high>{_NUM})\s*\])?"
                    rf"\s*(?:n\s*=\s*(?P<n>\d[\d,]*))?\s*$")


class ClaimError(ValueError):
    """A claim comment that cannot be parsed; the message names it and the expected form."""


@dataclass(frozen=True)
class Shown:
    """A figure as written: text of the value, interval bounds and count (None when not written)."""

    value: str
    percent: bool = False
    low: str | None = None
    high: str | None = None
    n: int | None = None


@dataclass(frozen=True)
class Claim:
    """One ``<!-- claim: report | row | metric | shown -->`` comment."""

    report: str
    row: str
    metric: str
    shown: Shown
    text: str  # the comment, for messages


def parse_shown(text: str) -> Shown:
    """``'92.8% [91.3, 94.3] n=3522'`` -> :class:`Shown`; a ClaimError names anything else."""
    m = _SHOWN.match(text)
    if not m:
        raise ClaimError(f"claim figure {text.strip()!r} is not 'VALUE[%] [LOW, HIGH] n=N' (interval and n optional)")
    return Shown(m["value"], bool(m["pct"]), m["low"], m["high"], int(m["n"].replace(",", "")) if m["n"] else None)


def parse_claims(text: str) -> list[Claim]:
    """Every claim comment of ``text``, in order."""
    out = []
    for m in CLAIM.finditer(text):
        parts = [p.strip() for p in re.split(r"\\?\|", m.group(1))]  # '\|' in a table cell
        if len(parts) != 4 or not all(parts):
            raise ClaimError(f"claim {m.group(0)!r} needs four fields: 'claim: report | row | metric | figure'")
        out.append(Claim(parts[0], parts[1], parts[2], parse_shown(parts[3]), m.group(0)))
    return out


def strip_claims(text: str) -> str:
    """``text`` without its claim comments (the prose a reader sees)."""
    return CLAIM.sub(" ", text)


def _decimals(s: str) -> int:
    return len(s.split(".", 1)[1]) if "." in s else 0


def _matches(written: str, actual: float | None, scale: float) -> bool:
    """Whether ``actual * scale`` rounds to the figure as written (at its number of decimals)."""
    if actual is None:
        return False
    d = _decimals(written)
    return f"{actual * scale:.{d}f}" == f"{float(written.replace(',', '')):.{d}f}"


def _table_rows(text: str) -> list[tuple[list[str], list[str]]]:
    """(header cells, row cells) of every body row of every Markdown table in ``text``."""
    out, header, in_body = [], None, False
    for line in text.splitlines():
        if not line.startswith("|"):
            header, in_body = None, False
            continue
        cells = [c.strip().replace("`", "") for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not in_body and all(set(c) <= set("-: ") for c in cells):
            in_body = True
        elif in_body:
            out.append((header, cells))
    return out


def report_text(root: Path, report: str) -> tuple[str | None, str | None]:
    """(text, None) of a claim's report under ``root``, or (None, the problem): ``path`` is the file in the tree,
    ``path@COMMIT`` the file as committed at ``COMMIT``."""
    path, _, commit = report.partition("@")
    if not commit:
        f = root / path
        return (f.read_text(encoding="utf-8"), None) if f.is_file() else (None, f"{report} does not exist")
    try:
        done = subprocess.run(["git", "-C", str(root), "show", f"{commit}:{path}"], capture_output=True, text=True)
    except OSError as exc:
        return None, f"{report}: git is needed to read a committed report ({exc})"
    if done.returncode != 0:
        return None, (f"{report}: not in this checkout's history ({done.stderr.strip().splitlines()[-1:]}); "
                      "a shallow clone lacks old commits: fetch with --unshallow")
    return done.stdout, None


def _lookup_json(text: str, name: str, row: str, metric: str) -> tuple[dict | None, str | None]:
    results = json.loads(text).get("results", {})
    if row not in results:
        return None, f"row {row!r} is not a run of {name}"
    if metric not in results[row]:
        return None, f"metric {metric!r} is not in row {row!r} of {name} (it has {', '.join(sorted(results[row]))})"
    return results[row][metric], None


def _lookup_table(text: str, name: str, row: str, metric: str) -> tuple[dict | None, str | None]:
    keys = [k.strip().replace("`", "") for k in row.split("&")]
    hits = [(h, c) for h, c in _table_rows(text) if c[:len(keys)] == keys and metric in h]
    if len(hits) != 1:
        return None, f"{len(hits)} table rows of {name} start with {keys} and have a column {metric!r} (need 1)"
    header, cells = hits[0]
    cell = cells[header.index(metric)] if header.index(metric) < len(cells) else ""
    m = re.match(rf"^\s*\(?(?P<value>{_NUM})\s*%?\s*(?:\[\s*(?P<low>{_NUM})\s*,\s*(?P<high>{_NUM})\s*\])?"
                 rf"(?:.*?\bn\s*=\s*(?P<n>\d[\d,]*))?", cell)
    if not m:
        return None, f"the cell {cell!r} (row {keys}, column {metric!r}) of {name} holds no figure"
    num = lambda s: None if s is None else float(s.replace(",", ""))  # noqa: E731
    return {"value": num(m["value"]), "ci_low": num(m["low"]), "ci_high": num(m["high"]),
            "n": None if m["n"] is None else int(m["n"].replace(",", "")), "_table": True}, None


def check_claim(claim: Claim, root: Path) -> list[str]:
    """The problems of one claim against the report under ``root`` (empty: it holds)."""
    text, err = report_text(root, claim.report)
    if err:
        return [err]
    name = claim.report.partition("@")[0]
    entry, err = (_lookup_json if name.endswith(".json") else _lookup_table)(text, name, claim.row, claim.metric)
    if err:
        return [err]
    s = claim.shown
    scale = 100.0 if (s.percent and not entry.get("_table")) else 1.0
    where = f"{claim.report} [{claim.row}] {claim.metric}"
    problems = []
    if not _matches(s.value, entry.get("value"), scale):
        problems.append(f"{where}: the README says {s.value}, the report {_show(entry.get('value'), scale)}")
    if s.low is not None:
        if not (_matches(s.low, entry.get("ci_low"), scale) and _matches(s.high, entry.get("ci_high"), scale)):
            problems.append(f"{where}: the README's interval [{s.low}, {s.high}] is not the report's "
                            f"[{_show(entry.get('ci_low'), scale)}, {_show(entry.get('ci_high'), scale)}]")
        v, lo, hi = (float(x.replace(",", "")) for x in (s.value, s.low, s.high))
        if not lo <= v <= hi:
            problems.append(f"{where}: the point {s.value} lies outside its interval [{s.low}, {s.high}]")
    if s.n is not None and entry.get("n") != s.n:
        problems.append(f"{where}: the README's count n={s.n} is not the report's n={entry.get('n')}")
    return problems


def _show(x, scale: float) -> str:
    return "n/a" if x is None else f"{x * scale:g}"


def unshown_figures(claim: Claim, prose: str) -> list[str]:
    """The figures of ``claim`` (value, interval, count) that ``prose`` does not state as written."""
    s = claim.shown
    want = [s.value] + ([f"[{s.low}, {s.high}]"] if s.low is not None else []) + \
        ([f"{s.n:,}", str(s.n)] if s.n is not None else [])
    prose = re.sub(r"\s+", " ", prose)  # an interval may break across lines
    found = [w for w in want if re.search(rf"(?<![\d.]){re.escape(w)}(?!\d|\.\d)", prose)]
    missing = [w for w in want[:2 if s.low is not None else 1] if w not in found]
    if s.n is not None and not ({f"{s.n:,}", str(s.n)} & set(found)):
        missing.append(str(s.n))
    return missing
