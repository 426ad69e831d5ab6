"""Compare a results document against a committed baseline (DESIGN.md §7).

Developer note: issue 7.

Rules, chosen by the *baseline* metric's ``kind`` (see ``benchmarks.schema``):

* ``exact``: current must equal baseline (numbers within an absolute 1e-9);
* ``accuracy``: current may not fall below ``baseline - tol`` (or rise above
  ``baseline + tol`` when lower is better), ``tol = max(ci_high - ci_low, 1e-9)``
  of the baseline;
* ``efficiency``: current may not fall below ``baseline * (1 - rel_tol)`` (or
  rise above ``baseline * (1 + rel_tol)`` when lower is better);
* ``info``: never compared.

Documents of an older schema major are first rewritten into the current
one by :data:`MIGRATIONS` (the versioning rule of :mod:`benchmarks.schema`),
so a renamed key, run or metric is compared under its new name.

A run or metric in the baseline but not in the current results is a
regression (rule ``missing``), and so is a metric whose ``kind`` changed
(rule ``kind``: update the baseline deliberately).  New runs and metrics are
fine. A plugin of the baseline (``config.plugins``) that is missing or whose
digest or version changed is a regression too (rule ``plugin``): a plugin
change is a code change.

CLI: ``python -m benchmarks.regress --baseline B.json --results R.json``
(mounted as ``splitinfer bench regress``): exit 0 when nothing regressed,
1 on regressions, 2 when a file is missing or invalid.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Sequence
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks import schema

logger = logging.getLogger(__name__)

__all__ = ["MIGRATIONS", "Regression", "add_arguments", "compare", "count_compared", "load_migrated", "main",
           "migrate", "plugin_regressions", "run"]

EXACT_ABS_TOL = 1e-9
MIN_ACCURACY_TOL = 1e-9
DEFAULT_EFFICIENCY_TOL = 0.15

# old major -> function rewriting a document of that major into major + 1 (renamed keys, runs, metrics)
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def migrate(doc: Any, migrations: dict[int, Callable[[dict], dict]] | None = None) -> Any:
    """``doc`` rewritten from its schema major up to the current one (unchanged when already current).

    A major with no migration is left as is, so :func:`schema.validate` names the mismatch.
    """
    steps = MIGRATIONS if migrations is None else migrations
    while isinstance(doc, dict) and isinstance(doc.get("schema_version"), int) and \
            doc["schema_version"] < schema.SCHEMA_VERSION and doc["schema_version"] in steps:
        old = doc["schema_version"]
        doc = steps[old](doc)
        doc["schema_version"] = old + 1
    return doc


def load_migrated(path: str) -> dict[str, Any]:
    """Read a results document, migrate it to the current schema major and validate it."""
    path = schema.results_path(path)  # the results.json, or the run directory that holds it
    doc = migrate(schema.read_json(path))
    try:
        schema.validate(doc)
    except schema.SchemaError as exc:
        raise schema.SchemaError(f"{path}: {exc}") from exc
    return doc


@dataclass(frozen=True)
class Regression:
    """One metric that got worse than the baseline allows.

    ``metric`` is ``"*"`` when a whole run is missing; ``current`` is None
    when the run or metric is missing.
    """

    run: str
    metric: str
    baseline: Any
    current: Any
    rule: str  # "exact" | "accuracy" | "efficiency" | "missing" | "kind" | "plugin"
    message: str

    def __str__(self) -> str:
        return f"REGRESSION {self.run} :: {self.metric} [{self.rule}]: {self.message}"


def _fmt(x: Any) -> str:
    return f"{x:.6g}" if isinstance(x, float) else repr(x)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_one(
    run: str, name: str, base: dict[str, Any], cur: dict[str, Any], rel_tol: float
) -> Regression | None:
    """The regression of one metric present on both sides, or None."""
    kind = base["kind"]
    b, c = base["value"], cur["value"]

    def reg(rule: str, message: str) -> Regression:
        return Regression(run, name, b, c, rule, message)

    if cur["kind"] != kind:
        return reg("kind", f"kind changed from {kind!r} to {cur['kind']!r}; update the baseline if intended")
    if kind == "info":
        return None
    if kind == "exact":
        same = abs(b - c) <= EXACT_ABS_TOL if _is_num(b) and _is_num(c) else (type(b) is type(c) and b == c)
        return None if same else reg("exact", f"must match exactly: baseline {_fmt(b)}, now {_fmt(c)}")
    higher = base["higher_is_better"]
    if kind == "accuracy":
        width = base["ci_high"] - base["ci_low"] if base["ci_low"] is not None else 0.0
        tol = max(width, MIN_ACCURACY_TOL)
        bad = c < b - tol if higher else c > b + tol
        word = "dropped" if higher else "rose"
        has_ci = width > MIN_ACCURACY_TOL
        why = f"allowed change {tol:.3g} = baseline CI width" if has_ci else "baseline has no CI"
        return reg("accuracy", f"{word} from {_fmt(b)} to {_fmt(c)} ({why})") if bad else None
    # efficiency: the tolerance widens to the baseline's own measured spread (ci width / value), when recorded
    if base["ci_low"] is not None and b:
        rel_tol = min(0.9, max(rel_tol, (base["ci_high"] - base["ci_low"]) / abs(b)))
    bad = c < b * (1 - rel_tol) if higher else c > b * (1 + rel_tol)
    if not bad:
        return None
    change = (c - b) / b if b else math.inf
    return reg("efficiency", f"{_fmt(b)} -> {_fmt(c)} ({change:+.1%}, tolerance {rel_tol:.0%})")


def compare(
    baseline: dict[str, Any], current: dict[str, Any], rel_tol_efficiency: float = DEFAULT_EFFICIENCY_TOL
) -> list[Regression]:
    """Every regression of ``current`` against ``baseline``, in baseline order.

    Both documents are validated first (``schema.SchemaError`` if invalid).
    """
    if not 0.0 <= rel_tol_efficiency < 1.0:
        raise ValueError(f"rel_tol_efficiency must lie in [0, 1), got {rel_tol_efficiency!r}")
    schema.validate(baseline)
    schema.validate(current)
    out: list[Regression] = plugin_regressions(baseline, current)
    cur_runs = current["results"]
    for run, metrics in baseline["results"].items():
        if run not in cur_runs:
            message = f"run missing from the results ({len(metrics)} metrics)"
            out.append(Regression(run, "*", None, None, "missing", message))
            continue
        for name, base in metrics.items():
            cur = cur_runs[run].get(name)
            if cur is None:
                message = "metric missing from the results"
                out.append(Regression(run, name, base["value"], None, "missing", message))
                continue
            found = _check_one(run, name, base, cur, rel_tol_efficiency)
            if found is not None:
                out.append(found)
    return out


def plugin_regressions(baseline: dict[str, Any], current: dict[str, Any]) -> list[Regression]:
    """One ``plugin`` regression per plugin of the baseline that is missing now or whose digest, version or
    distribution changed: a plugin change is a code change, and its components' figures are then no longer the
    baseline's (regenerate the baseline deliberately). A plugin only the current run loads is new, not a change."""
    now = {p["name"]: p for p in current["config"].get("plugins") or []}
    out = []
    for p in baseline["config"].get("plugins") or []:
        change = schema.plugin_change([p], [now[p["name"]]] if p["name"] in now else [])
        if change:
            out.append(Regression("config.plugins", p["name"], p.get("digest"),
                                  now.get(p["name"], {}).get("digest"), "plugin",
                                  f"{change}; a plugin change is a code change: rerun from the plugin version of "
                                  "the baseline, or regenerate the baseline deliberately (bench baseline)"))
    return out


def count_compared(baseline: dict[str, Any], current: dict[str, Any]) -> int:
    """How many baseline metrics ``compare`` checks: present on both sides and not ``info``."""
    cur_runs = current.get("results", {})
    return sum(
        1
        for run, metrics in baseline.get("results", {}).items()
        for name, m in metrics.items()
        if name in cur_runs.get(run, {}) and m.get("kind") != "info"
    )


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1), got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the regress options to ``parser`` (so a CLI can mount it as a subcommand)."""
    parser.add_argument("--baseline", required=True, metavar="PATH", help="committed baseline results JSON")
    parser.add_argument("--results", required=True, metavar="PATH",
                        help="results JSON to check (or its run directory)")
    parser.add_argument(
        "--efficiency-tolerance",
        type=_tolerance,
        default=DEFAULT_EFFICIENCY_TOL,
        metavar="FRAC",
        help="allowed relative drop of efficiency metrics (default %(default)s)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the check for parsed ``args``; print findings; return the exit code."""
    try:
        baseline = load_migrated(args.baseline)
        current = load_migrated(args.results)
    except schema.SchemaError as exc:
        print(f"regress: error: {exc}", file=sys.stderr)
        return 2
    regressions = compare(baseline, current, args.efficiency_tolerance)
    n = count_compared(baseline, current)
    for r in regressions:
        print(r)
    if regressions:
        print(f"regress: {len(regressions)} REGRESSIONS ({n} metrics compared, baseline {args.baseline})")
        return 1
    print(f"regress: {n} metrics compared, 0 regressions")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse ``argv`` and :func:`run`.  Bad options exit 2 via argparse."""
    parser = argparse.ArgumentParser(prog="splitinfer bench regress", description=__doc__.splitlines()[0])
    return run(add_arguments(parser).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
