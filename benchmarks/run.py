"""Run a benchmark suite end to end: results.json, report.md and PNG plots.

``run_suite`` loads the suite's model once, runs each stage the suite
declares (exactness, speed, rtt_model, attacks, ngram_ablation), records every
metric with its CI and n in the versioned results document
(:mod:`benchmarks.schema`), keeps the raw rows under ``data`` for the report,
and writes the report and plots (:mod:`benchmarks.report`).
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.schema import new_results, save
from benchmarks.suite import Suite
from splitinfer.models import load_model

log = logging.getLogger(__name__)

STAGE_ORDER = ("exactness", "speed", "rtt_model", "ngram_ablation", "attacks", "defenses")


def _stage_fn(name: str):
    if name in ("exactness", "speed", "rtt_model"):
        from benchmarks import stage_speed

        return getattr(stage_speed, f"stage_{name}")
    if name == "attacks":
        from benchmarks.stage_attacks import stage_attacks

        return stage_attacks
    if name == "ngram_ablation":
        from benchmarks.stage_ablation import stage_ngram_ablation

        return stage_ngram_ablation
    if name == "defenses":
        from benchmarks.stage_defenses import stage_defenses

        return stage_defenses
    raise KeyError(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_suite(suite: Suite, out_dir: str | Path, stages: list[str] | None = None) -> Path:
    """Run ``suite`` (optionally only some ``stages``) and write everything under ``out_dir``."""
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
    }
    results = new_results(config, suite.name)
    data: dict = {}
    todo = [s for s in STAGE_ORDER if s in suite.stages and (stages is None or s in stages)]
    for name in todo:
        t = time.perf_counter()
        log.info("stage %s", name)
        seed_everything(suite.seed)
        data[name] = _stage_fn(name)(loaded, suite.stages[name], results)
        data.setdefault("stage_seconds", {})[name] = time.perf_counter() - t
    data["total_seconds"] = time.perf_counter() - t0
    results["data"] = data
    path = save(results, out / "results.json")
    from benchmarks.report import write_report

    write_report(results, out)
    return path
