"""The new-defenses study: the defenses stage one spec at a time, each row written as soon as it is done.

Developer note: built for issue 29.

Runs :func:`benchmarks.stage_defenses.stage_defenses` on the ``defenses-new`` suite's ``[defenses]`` table with
one spec per call (tap extractions are cached on disk, so only the first call extracts), and after each spec
rewrites ``rows.json`` and ``report.md`` under ``--out`` (atomically), so a shared, loaded CPU that stops the run
early still leaves every finished row. The figures are the stage's own (DESIGN.md section 8).

    flock /tmp/heavy.lock python -m benchmarks.defenses_new_study --out reports/defenses_new
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks.bench_output import document, write_dir
from benchmarks.stage_defenses import defenses_section, stage_defenses
from benchmarks.suite_names import checked_suite
from splitinfer.errors import SplitInferError
from splitinfer.models import load_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="defenses-new")
    ap.add_argument("--out", required=True)
    ap.add_argument("--specs", default=None, help="';'-separated subset of the suite's defense specs, in this order")
    args = ap.parse_args(argv)
    try:
        suite = checked_suite(args.suite)
    except SplitInferError as e:
        ap.error(str(e))
    cfg = dict(suite.stage("defenses"))
    specs = args.specs.split(";") if args.specs else list(cfg["defenses"])
    loaded = load_model(suite.model)
    config = {"model": suite.model, "model_sha256": loaded.sha256, "seed": suite.seed, "suite": suite.name}
    rows, seconds, t0 = [], {}, time.perf_counter()
    for spec in specs:
        results = {"config": {"seed": suite.seed}, "results": {}}
        t1 = time.perf_counter()
        out = stage_defenses(loaded, {**cfg, "defenses": [spec]}, results)
        rows += out["rows"]
        seconds[spec] = time.perf_counter() - t1
        data = {"rows": rows, "seconds": time.perf_counter() - t0, "spec_seconds": seconds,
                "attacker_options": out["attacker_options"]}
        doc = document("defenses-new-study", config, data)
        write_dir(args.out, "\n".join(["# The calibrated and trained defenses: a first study", "", f"Suite `{suite.name}`, model "
                                       f"`{suite.model}`; seconds per spec: " + ", ".join(
                                           f"`{s}` {t:.0f}" for s, t in seconds.items()), ""]
                                      + defenses_section(data, Path(args.out))), doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
