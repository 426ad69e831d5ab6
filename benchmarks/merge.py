"""``splitinfer bench merge OUT SHARD_DIR...``: join the shards of one suite run into one results file and report.

Each shard directory holds the ``results.json`` of ``bench run --shard I/N``
(:mod:`benchmarks.shard`) and its per-token predictions. The shards must be
one run: the same suite, config (model and its sha256, seed, stage tables; the
torch thread count may differ), code (the same commit, or commits with the same
``code_digest``: they differ in reports, docs or tests only; the merge lists
them as ``git_hashes``; a differing digest is refused even under one commit)
and schema, plugins (the same digests: a plugin change is a code change), shard count N, and every index 0..N-1
exactly once; anything else is a one-line error naming the difference. The merged document
is what one unsharded run writes (the same runs and metrics; rows of the grid
stages in job order), with ``merged_shards`` recorded; the stage times are the
sums over the shards (processor time, not wall time when the shards ran side
by side). It is validated by :mod:`benchmarks.schema` before it is written.

``--partial`` merges a set with shards still missing (a grid that takes more
than one machine's night, run a few shards at a time): shard 0 must be there
(it holds the stages that are not grids), the missing indices are recorded as
``missing_shards`` and the report's header says that every figure covers the
merged shards only. Everything else is checked as for a complete set.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

from benchmarks.checkout import git_state
from benchmarks.schema import SCHEMA_MINOR, SchemaError, load, plugin_change, results_path, save
from benchmarks.stages import STAGES

_PER_MACHINE = ("torch_threads",)  # config keys shards on different machines may differ in


def _why_differ(a: dict, b: dict, where: str) -> str | None:
    """The first key path where two JSON values differ, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{where}.{k}"
            found = _why_differ(a[k], b[k], f"{where}.{k}")
            if found:
                return found
        return None
    return None if a == b else where


def check_shards(docs: list[tuple[Path, dict]], partial: bool = False) -> tuple[int, list[int]]:
    """Refuse shards that are not one run's (complete, unless ``partial``) set; return (N, missing indices)."""
    if not docs:
        raise SchemaError("bench merge: give at least one shard directory (bench run --shard I/N --out DIR)")
    for path, d in docs:
        if "shard" not in d:
            raise SchemaError(f"{path} is not a shard (no 'shard' key): make shards with bench run --shard I/N")
        shard = d["shard"]
        if not (isinstance(shard, dict) and all(isinstance(shard.get(k), int) and not isinstance(shard.get(k), bool)
                                                for k in ("index", "count"))
                and shard["count"] >= 1 and 0 <= shard["index"] < shard["count"]):
            raise SchemaError(f"{path}: shard {shard!r} is not an index I of a count N with 0 <= I < N; "
                              "the file is damaged: rerun that shard with bench run --shard I/N")
        if not isinstance(d.get("data"), dict):
            raise SchemaError(f"{path}: the shard has no 'data' table (its grid rows); the file is damaged: "
                              "rerun that shard with bench run --shard I/N")
        for name, part in d["data"].items():
            rows = part.get("rows", []) if isinstance(part, dict) and name in STAGES else []
            if not (isinstance(rows, list) and all(isinstance(r, dict) for r in rows)):
                raise SchemaError(f"{path}: data.{name}.rows is not a list of rows; the file is damaged: "
                                  "rerun that shard with bench run --shard I/N")
    (p0, d0) = docs[0]
    for path, d in docs[1:]:
        for key in ("suite", "schema_version"):
            if d[key] != d0[key]:
                raise SchemaError(f"{path}: {key} {d[key]!r} differs from {d0[key]!r} in {p0}; merge the shards "
                                  "of one run (same suite, commit and seed)")
        if d["git_hash"] != d0["git_hash"] and (d.get("code_digest") is None or
                                                d.get("code_digest") != d0.get("code_digest")):
            raise SchemaError(f"{path}: git_hash {d['git_hash']!r} differs from {d0['git_hash']!r} in {p0} and so "
                              "does the code (code_digest); merge the shards of one run (same code, suite and seed)")
        if None not in (d.get("code_digest"), d0.get("code_digest")) and d["code_digest"] != d0["code_digest"]:
            raise SchemaError(f"{path}: code_digest {d['code_digest'][:12]!r} differs from "
                              f"{d0['code_digest'][:12]!r} in {p0} (the code changed between the shards, e.g. in a "
                              "dirty tree); merge the shards of one run (same code, suite and seed)")
        plugin = plugin_change(d0["config"].get("plugins"), d["config"].get("plugins"))
        if plugin:
            raise SchemaError(f"{path}: {plugin} against {p0}; a plugin change is a code change: merge the shards "
                              "of one run (same code and plugins, suite and seed)")
        diff = _why_differ({k: v for k, v in d0["config"].items() if k not in _PER_MACHINE},
                           {k: v for k, v in d["config"].items() if k not in _PER_MACHINE}, "config")
        if diff:
            raise SchemaError(f"{path}: {diff} differs from {p0}; merge the shards of one run (same suite, model, "
                              "seed and stage tables)")
    counts = {d["shard"]["count"] for _, d in docs}
    if len(counts) > 1:
        raise SchemaError(f"the shards were cut into different counts {sorted(counts)}; merge one run's shards")
    n = counts.pop()
    seen: dict[int, Path] = {}
    for path, d in docs:
        i = d["shard"]["index"]
        if i in seen:
            raise SchemaError(f"shard {i}/{n} given twice ({seen[i]} and {path}); give each shard once")
        seen[i] = path
    missing = sorted(set(range(n)) - set(seen))
    if missing and not partial:
        raise SchemaError(f"shard(s) {', '.join(f'{i}/{n}' for i in missing)} missing; give all {n} shard "
                          "directories, or merge what is there with --partial")
    if 0 in missing:
        raise SchemaError(f"shard 0/{n} missing: a partial merge needs shard 0 (the stages that are not grids run "
                          "there); run bench run --shard 0/N first")
    return n, missing


def _merge_rows(parts: list[dict]) -> list[dict]:
    """Grid rows of every shard in job order (each job's rows keep their own order)."""
    return sorted((r for p in parts for r in p.get("rows", [])), key=lambda r: r.get("job", -1))


def merge_attacks(parts: list[dict]) -> dict:
    from benchmarks.stage_attacks import derived

    rows = _merge_rows(parts)
    return {**parts[0], "rows": rows, **derived(rows), "extract_seconds": sum(p["extract_seconds"] for p in parts)}


def merge_defenses(parts: list[dict]) -> dict:
    first = parts[0]  # shard 0: random-split rows and overhead timings
    return {**first, "rows": _merge_rows(parts), "seconds": sum(p["seconds"] for p in parts),
            "skipped": [s for p in parts for s in p.get("skipped", [])]}


MERGERS = {"attacks": merge_attacks, "defenses": merge_defenses}  # every shardable stage (tested)


def _merge_metrics(docs: list[tuple[Path, dict]]) -> dict:
    out: dict = {}
    for path, d in docs:
        for run, metrics in d["results"].items():
            for name, m in metrics.items():
                have = out.setdefault(run, {}).get(name)
                if have is None:
                    out[run][name] = copy.deepcopy(m)
                elif run.startswith("harness/stage=") and name == "wall_s":
                    have["value"] += m["value"]  # the stage's time summed over the shards
                elif have != m:
                    raise SchemaError(f"{path}: results[{run!r}][{name!r}] differs from another shard's; shards "
                                      "of one run never measure the same thing twice")
    return out


def merged_by() -> dict:
    """``{"git_hash", "git_dirty"}`` of the checkout that runs a merge (not the code of the merged parts)."""
    return dict(zip(("git_hash", "git_dirty"), git_state()))


def copy_predictions(part_dirs: list[Path], out: Path) -> None:
    """Every part's per-token predictions into ``out/predictions/`` (their names carry the run: none collide)."""
    for part in part_dirs:
        for f in sorted((part / "predictions").glob("*.jsonl.gz")):
            (out / "predictions").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, out / "predictions" / f.name)


def merge_results(docs: list[tuple[Path, dict]], partial: bool = False) -> dict:
    """One results document from a complete (or, with ``partial``, an incomplete) set of shards."""
    n, missing = check_shards(docs, partial)
    docs = sorted(docs, key=lambda x: x[1]["shard"]["index"])
    first = docs[0][1]
    merged = {k: copy.deepcopy(v) for k, v in first.items() if k not in ("shard", "results", "data")}
    merged["git_dirty"] = True if any(d["git_dirty"] for _, d in docs) else first["git_dirty"]
    merged["date"] = max(d["date"] for _, d in docs)
    merged["merged_shards"] = n
    merged["schema_minor"] = max(int(merged.get("schema_minor") or 0), SCHEMA_MINOR)  # merged_by: every merge
    if missing:
        merged["missing_shards"] = missing
    merged["merged_by"] = merged_by()
    commits = sorted({d["git_hash"] for _, d in docs})
    if len(commits) > 1:  # one code_digest: commits that differ outside the code only
        merged["git_hashes"] = commits
    merged["results"] = _merge_metrics(docs)
    failed = [f for _, d in docs for f in d.get("failed_components", [])]
    if failed:
        merged["failed_components"] = failed
    datas = [d.get("data", {}) for _, d in docs]
    data: dict = {}
    for name in STAGES:
        parts = [x[name] for x in datas if name in x]
        if parts:
            data[name] = MERGERS[name](parts) if STAGES[name].shardable else parts[0]
    seconds: dict = {}
    for x in datas:
        for name, s in x.get("stage_seconds", {}).items():
            seconds[name] = seconds.get(name, 0.0) + s
    data["stage_seconds"] = seconds
    data["stage_budget_s"] = {k: v for x in datas for k, v in x.get("stage_budget_s", {}).items()}
    data["total_seconds"] = sum(x.get("total_seconds", 0.0) for x in datas)
    merged["data"] = data
    return merged


def merge_dirs(out_dir: str | Path, shard_dirs: list[str | Path], partial: bool = False) -> Path:
    """Merge the shards under ``shard_dirs`` into ``out_dir``: results.json, predictions, report.md and plots."""
    from benchmarks.report import write_report

    docs = [(results_path(s), load(results_path(s))) for s in shard_dirs]
    out = Path(out_dir)
    inside = [p for p, _ in docs if p.parent.resolve() == out.resolve()]
    if inside:
        raise SchemaError(f"bench merge: the output {out} is shard {inside[0].parent}; merging there would overwrite "
                          "it: give a new directory for the merged run")
    merged = merge_results(docs, partial)
    out.mkdir(parents=True, exist_ok=True)
    copy_predictions([path.parent for path, _ in docs], out)
    path = save(merged, out / "results.json")
    write_report(merged, out)
    return path


def cmd_merge(args) -> int:
    path = merge_dirs(args.out, args.shards, args.partial)
    print(f"results written to {path}")
    print(f"report written to {Path(args.out) / 'report.md'}")
    return 0


def register(bsub) -> None:
    m = bsub.add_parser("merge", help="join the shards of one suite run (bench run --shard I/N) into one results "
                                      "file and report")
    m.add_argument("out", help="output directory")
    m.add_argument("shards", nargs="+", help="the shard directories (or their results.json), one per shard")
    m.add_argument("--partial", action="store_true",
                   help="merge an incomplete set (shard 0 included); the report says which shards are missing")
    m.set_defaults(func=cmd_merge)
