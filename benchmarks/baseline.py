"""``splitinfer bench baseline OUT RESULTS...``: one regression baseline from repeated runs of one suite.

``regress`` allows a timing-derived metric (kind ``efficiency``) to move by the
baseline's own interval relative to its value (or by ``--efficiency-tolerance``
where that is wider). A single run's interval is the spread *within* it (its
8-step blocks), which says nothing about how far a rerun lands (issue 15, item
4: the ci baseline's 1.146 came back as 0.945 on a fresh machine). Folding R
runs of the same suite, made from the same commit on one machine, gives every
timing metric the spread *between* runs:

- ``efficiency`` metrics: value = the median of the runs; the interval covers
  every run's value and its own interval; ``n`` sums the runs' samples;
- ``info`` metrics (wall times and the like, never compared): the first run's;
- every other metric (``exact``, ``accuracy``: seeded, so deterministic) must
  come out the same in every run; a difference is refused with a one-line error
  naming the metric, since a baseline would otherwise hide a nondeterminism.

The folded document records ``baseline_runs = R`` and is schema-valid. Runs that left a component out
(``failed_components``) are refused: a baseline never hides a failed component.
"""

from __future__ import annotations

import copy
import statistics
from pathlib import Path

from benchmarks.schema import SchemaError, load, results_path, save

SAME_RUN_KEYS = ("suite", "git_hash", "git_dirty", "schema_version", "config")
DETERMINISTIC_ABS_TOL = 1e-9  # float rounding of values written to JSON and read back


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= DETERMINISTIC_ABS_TOL
    return a == b


def _fold_efficiency(ms: list[dict]) -> dict:
    out = copy.deepcopy(ms[0])
    values = [m["value"] for m in ms]
    lows = [x for m in ms for x in (m["value"], m["ci_low"]) if x is not None]
    highs = [x for m in ms for x in (m["value"], m["ci_high"]) if x is not None]
    counts = [m["n"] for m in ms if m["n"] is not None]
    out.update(value=statistics.median(values), ci_low=min(lows), ci_high=max(highs),
               n=sum(counts) if counts else None)  # no run counted its samples: unknown, not 0
    return out


def fold(docs: list[tuple[Path, dict]]) -> dict:
    """One baseline document from R >= 2 results documents of one suite run repeatedly (module docstring)."""
    if len(docs) < 2:
        raise SchemaError("bench baseline: give at least 2 results files of the same suite (run it 2+ times)")
    (p0, d0) = docs[0]
    for path, d in docs:
        if d.get("failed_components"):
            f = d["failed_components"][0]
            raise SchemaError(f"{path}: {f['kind']} {f['name']!r} failed in that run ({len(d['failed_components'])} "
                              "component(s) left out); fix it and rerun before making a baseline")
    for path, d in docs[1:]:
        for key in SAME_RUN_KEYS:
            if d.get(key) != d0.get(key):
                raise SchemaError(f"{path}: {key} differs from {p0}; fold repeated runs of one suite from one "
                                  "commit and config")
    out = {k: copy.deepcopy(v) for k, v in d0.items() if k != "results"}
    out["baseline_runs"] = len(docs)
    out["results"] = {}
    names = {(run, name): None for _, d in docs for run, metrics in d["results"].items() for name in metrics}
    for run, name in names:  # every metric of any run, in first-seen order: each run must have it
        folded = out["results"].setdefault(run, {})
        ms = []
        for path, d in docs:
            other = d["results"].get(run, {}).get(name)
            if other is None:
                raise SchemaError(f"{path}: results[{run!r}][{name!r}] is missing; fold complete runs")
            ms.append(other)
        m = ms[0]
        if m["kind"] == "efficiency":
            folded[name] = _fold_efficiency(ms)
        elif m["kind"] == "info":
            folded[name] = copy.deepcopy(m)
        else:
            diff = next(((path, o) for (path, _), o in zip(docs[1:], ms[1:]) if not _same(o["value"], m["value"])),
                        None)
            if diff is not None:
                raise SchemaError(f"results[{run!r}][{name!r}] is {m['value']!r} in {p0} but {diff[1]['value']!r} "
                                  f"in {diff[0]}: a {m['kind']} metric must not vary between runs of one commit "
                                  "(seed it, or make it kind 'info')")
            folded[name] = copy.deepcopy(m)
    return out


def cmd_baseline(args) -> int:
    paths = [results_path(p) for p in args.results]
    seen: dict[Path, Path] = {}
    for p in paths:
        if p.resolve() in seen:
            raise SchemaError(f"bench baseline: {p} is given twice (as {seen[p.resolve()]}); one run folded twice "
                              "would show no spread: give each run's results once")
        seen[p.resolve()] = p
    path = save(fold([(p, load(p)) for p in paths]), args.out)
    print(f"baseline of {len(paths)} runs written to {path}")
    return 0


def register(bsub) -> None:
    b = bsub.add_parser("baseline", help="fold repeated runs of one suite into a regress baseline whose timing "
                                         "tolerances are the measured run-to-run spread")
    b.add_argument("out", help="the baseline file to write (e.g. reports/baseline/ci.json)")
    b.add_argument("results", nargs="+", help="2+ results.json files (or their directories) of the same suite")
    b.set_defaults(func=cmd_baseline)
