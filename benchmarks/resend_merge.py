"""Join resend sweeps run one spec (or a few) at a time into one sweep: ``resend_sweep --merge DIR... --out OUT``.

A resend cell fitted per r takes about half an hour on two CPU cores (and a head-8 cell about four times that),
so a sweep over many specs is run as several sweeps: one per spec, in turn or side by side on a machine with
more cores or a GPU, each writing its own directory when it finishes. The parts must be one run: the same model
(sha256), suite, repeats, device and code (the same ``code_digest``: commits that differ in reports, docs or
tests only), and no row may appear twice; anything else is a one-line error naming the difference. The
merged directory is what one sweep over all their specs writes (rows in the order the parts are given, the wall
time their sum: processor time when they ran side by side; ``git_dirty`` if any part's was), plus ``merged_from``
(each part's directory, commit and wall time) and ``merged_by`` (the checkout that merged).
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.merge import merged_by
from splitinfer.errors import SplitInferError

SAME = {"model_sha256": None, "suite": None, "repeats": None, "device": "cpu"}  # data keys every part shares,
# with the value a document that predates the key records (sweeps before --device ran on the CPU)


def load_sweep(directory: str | Path, option: str) -> dict:
    """The results document a resend sweep wrote to ``directory``; a one-line error naming ``option`` if absent."""
    try:
        doc = json.loads((Path(directory) / "results.json").read_text(encoding="utf-8"))
        doc["data"]["rows"]  # noqa: B018 (a resend sweep's document has rows)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SplitInferError(f"{option} {directory}: no resend-sweep results.json with data.rows there ({exc!r}); "
                              "give a directory that resend_sweep --out wrote") from None
    if doc.get("suite") != "bench-resend-sweep":
        raise SplitInferError(f"{option} {directory}: its results.json is a {doc.get('suite')!r} document, not a "
                              "resend sweep's")
    return doc


def merge_data(parts: list[tuple[Path, dict]]) -> dict:
    """The ``data`` of one sweep over every part's specs; refuses parts that are not one run."""
    if len(parts) < 2:
        raise SplitInferError("--merge: give at least two sweep directories to join")
    (p0, d0) = parts[0]
    seen: dict[str, Path] = {}
    for path, doc in parts:
        for key, before in SAME.items():
            if doc["data"].get(key, before) != d0["data"].get(key, before):
                raise SplitInferError(f"--merge: {path} has {key} {doc['data'].get(key, before)!r}, {p0} has "
                                      f"{d0['data'].get(key, before)!r}; join only sweeps of one model, suite, "
                                      "repeats and device")
        if doc.get("code_digest") != d0.get("code_digest"):
            raise SplitInferError(f"--merge: {path} ran other code than {p0} (code_digest differs: commits "
                                  f"{doc.get('git_hash')} and {d0.get('git_hash')}); rerun one of them at the "
                                  "other's commit")
        for row in doc["data"]["rows"]:
            if row["run"] in seen:
                raise SplitInferError(f"--merge: row {row['run']!r} is in both {seen[row['run']]} and {path}; "
                                      "give each spec's sweep once")
            seen[row["run"]] = path
    data = {k: v for k, v in d0["data"].items() if k not in ("rows", "specs", "wall_s")}
    data["specs"] = [s for _, d in parts for s in d["data"]["specs"]]
    data["rows"] = [r for _, d in parts for r in d["data"]["rows"]]
    data["wall_s"] = sum(float(d["data"]["wall_s"]) for _, d in parts)
    data["merged_from"] = [{"dir": str(p), "git": d.get("git_hash"), "wall_s": d["data"]["wall_s"],
                            "date": d.get("date")} for p, d in parts]
    return data


def load_parts(dirs: list[str | Path]) -> list[tuple[Path, dict]]:
    """``(directory, results document)`` of each sweep directory, checked to be a resend sweep's."""
    return [(Path(d), load_sweep(d, "--merge")) for d in dirs]


def provenance(parts: list[tuple[Path, dict]]) -> dict:
    """The top-level keys of the joined document that describe the parts' code and runs, not the merging
    checkout's (recorded as ``merged_by``)."""
    first = parts[0][1]
    return {**{k: first[k] for k in ("git_hash", "code_digest", "versions")},
            "git_dirty": any(d["git_dirty"] for _, d in parts), "date": max(d["date"] for _, d in parts),
            "merged_by": merged_by()}
