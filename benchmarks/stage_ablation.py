"""Harness stage: the seed paper's n-gram ablation (section 6.4) on our model, inside a suite.

Runs :func:`benchmarks.decoding.run_decoding_bench` on the suite's prompt
categories (``ngram-pool`` n = 3..7 and the other proposers, ``lookahead``
N = 3..7), keeps its per-label summary (tau per category, acceptance,
modelled tok/s) and records tau per label in the results document.
"""

from __future__ import annotations

from benchmarks.decoding import DEFAULT_PROPOSERS, run_decoding_bench
from benchmarks.decoding_report import format_report, summarize, targets
from benchmarks.schema import add_metric, metric
from splitinfer.client import SplitModel
from splitinfer.models import LoadedModel


def stage_ngram_ablation(loaded: LoadedModel, cfg: dict, results: dict) -> dict:
    sm = SplitModel(loaded, cfg.get("split", "2,2"), wire_dtype="fp32")
    per_category = cfg.get("prompts_per_category", 2)
    raw = run_decoding_bench(sm, max_new_tokens=cfg.get("tokens", 100), prompts_per_category=per_category,
                             ablation=True, ablation_prompts=1, subset_prompts=per_category,
                             proposers=[*DEFAULT_PROPOSERS, "jacobi", "lookahead"])
    table = summarize(raw)
    for label, row in table.items():
        add_metric(results, f"ngram_ablation/{label}", "tau_mean", metric(row["tau"]["mean"], n=row["n"],
                                                                          kind="info", unit="tokens/step"))
    return {"table": table, "targets": targets(table, raw), "text": format_report(raw)}


def ablation_section(data: dict) -> list[str]:
    return ["## Decoding ablation (the seed's section 6.4 on our model)", "", "```", data["text"], "```", ""]
