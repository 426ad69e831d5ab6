"""Run a benchmark suite end to end: results.json, report.md and PNG plots.

``run_suite`` loads the suite's model once, runs each stage the suite
declares in the order of the stage registry (:mod:`benchmarks.stages`), records
every metric with its CI and n in the versioned results document
(:mod:`benchmarks.schema`), keeps the raw rows under ``data`` for the report,
and writes the report and plots (:mod:`benchmarks.report`).

Each stage's wall time is printed next to its budget (the table's ``budget_s``)
and recorded: ``data["stage_seconds"]``, ``data["stage_budget_s"]`` and the
``info`` metrics ``wall_s`` / ``budget_s`` of run ``harness/stage=NAME``.

With ``shard`` (``bench run --shard I/N``, :mod:`benchmarks.shard`) the
document records its shard, the shardable stages run every N-th grid cell
and the others run in shard 0 only; ``bench merge`` joins the shards.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

from attacks.predictions import write_all
from benchmarks.schema import add_metric, metric, new_results, save
from benchmarks.shard import Shard
from benchmarks.stages import STAGES
from benchmarks.suite import Suite
from splitinfer.errors import SplitInferError
from splitinfer.tokens import tokenisation_record
from splitinfer.models import load_model

log = logging.getLogger(__name__)

def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def budget_line(name: str, wall_s: float, budget_s: float | None) -> str:
    """``stage speed: 61.2 s (budget 90 s)``, flagged when over budget."""
    if budget_s is None:
        return f"stage {name}: {wall_s:.1f} s (no budget)"
    over = "  OVER BUDGET" if wall_s > budget_s else ""
    return f"stage {name}: {wall_s:.1f} s (budget {budget_s:g} s){over}"


def record_stage_time(results: dict, data: dict, name: str, wall_s: float, budget_s: float | None) -> None:
    """Print the stage's wall time against its budget; keep both in ``data`` and as info metrics."""
    print(budget_line(name, wall_s, budget_s), file=sys.stderr, flush=True)
    data.setdefault("stage_seconds", {})[name] = wall_s
    data.setdefault("stage_budget_s", {})[name] = budget_s
    run = f"harness/stage={name}"
    add_metric(results, run, "wall_s", metric(wall_s, higher_is_better=False, kind="info", unit="s"))
    add_metric(results, run, "budget_s", metric(budget_s, higher_is_better=False, kind="info", unit="s"))


def run_suite(suite: Suite, out_dir: str | Path, stages: list[str] | None = None, shard: Shard = Shard()) -> Path:
    """Run ``suite`` (optionally only some ``stages``, or one ``shard``) and write everything under ``out_dir``."""
    if stages is not None:
        unknown = sorted(set(stages) - set(suite.stages))
        if unknown:
            raise SplitInferError(f"--stages {','.join(unknown)}: not in suite {suite.name!r} "
                                  f"(its stages: {', '.join(suite.stages)})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    seed_everything(suite.seed)
    t0 = time.perf_counter()
    loaded = load_model(suite.model, dtype=suite.dtype, device=suite.device, seed=suite.seed)
    config = {
        "suite": suite.name,
        "suite_file": Path(suite.path).name,
        "model": suite.model,
        "model_sha256": loaded.sha256,
        "num_layers": loaded.num_layers,
        "hidden_size": loaded.hidden_size,
        "dtype": suite.dtype,
        "device": suite.device,
        "seed": suite.seed,
        "torch_threads": torch.get_num_threads(),
        "stages": suite.stages,
        "tokenisation": tokenisation_record(loaded.tokenizer),
    }
    results = new_results(config, suite.name)
    if not shard.whole:
        results["shard"] = shard.record()
    data: dict = {}
    todo = [s for s in STAGES if s in suite.stages and (stages is None or s in stages)
            and (shard.first or STAGES[s].shardable)]
    for name in todo:
        t = time.perf_counter()
        log.info("stage %s", name)
        seed_everything(suite.seed)
        data[name] = STAGES[name].function()(loaded, suite.stages[name], results)
        if isinstance(data[name], dict):  # per-token predictions go beside results.json, not into it
            write_all(data[name].pop("predictions", {}), out)
        record_stage_time(results, data, name, time.perf_counter() - t, suite.budget_s(name))
    data["total_seconds"] = time.perf_counter() - t0
    results["data"] = data
    path = save(results, out / "results.json")
    from benchmarks.report import write_report

    write_report(results, out)
    return path
