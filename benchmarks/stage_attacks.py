"""Harness stage: inversion attacks per split depth (issue 6's attackers inside a suite).

A thin reading of the suite's ``[attacks]`` section onto the attack grid
(:mod:`benchmarks.attack_grid`, shared with the per-depth study): taps of the
train and test splits of each corpus at every boundary (``head:A``: the
states the cloud receives, ``tail:B``: those it returns), each attacker fitted
on the pooled training taps of every boundary its side admits, scored on the
pooled held-out test documents (95% bootstrap CIs over documents) and per
corpus, with PII recovery by type. Every head-side attacker is also scored on
the depth's common scored set (the suite's ``scored_set`` table,
:mod:`benchmarks.scored_set`; the defenses stage scores the same set), and
prefix-scored attackers (``vocab-match``) on that set alone; the report's
summary and common-set table compare attackers there (issue 28). Output-side
attackers are scored on ``wire_tokens`` generated tokens per corpus of real
split generation.

Under ``bench run --shard I/N`` (:mod:`benchmarks.shard`) the stage runs the
(attacker, boundary) jobs of :func:`plan` numbered ``j % N == I`` (rows carry
``job = j``) and the depth identifiers in shard 0 only; :func:`derived` makes
the report's PII rows and baselines from the rows, here and after a merge.
"""

from __future__ import annotations

import logging
import time

from attacks.boundary import Boundary
from attacks.plugins import droppable
from attacks.registry import get_attack_class
from benchmarks.attack_grid import ALIASES, GridConfig, Victim, depth_rows, extract, plan, run_job
from benchmarks.attack_wire import record_traffic
from benchmarks.schema import add_metric, metric, record_failure
from benchmarks.scored_set import ScoredSetConfig
from benchmarks.shard import Shard
from splitinfer.models import LoadedModel

log = logging.getLogger(__name__)

RECORDED = ("token_acc_top1", "token_acc_top5", "token_f1", "exact_match", "template_token_acc_top1", "coverage",
            "baseline_position_top1", "baseline_unigram_top1", "lift_token_acc_top1", "lift_exact_match")
THREAT_NOTE = ("white-box (exact) = inverts the published local layers (vocab-match) or runs the published tail "
               "(tail-logits); white-box (learned) = trains on its own (state, token) pairs made with the published "
               "weights. Every victim here runs the published weights, so no result is shadow (DESIGN.md section 4).")


PREFIX_SUITE_KEYS = ("scored_tokens", "pii_tokens")  # suite-only options of a prefix-scored attacker: tokens scored


def suite_only_keys(name: str) -> tuple[str, ...]:
    """The keys of attacker ``name``'s ``options`` that this stage reads itself, not hyper-parameters: how many
    tokens a prefix-scored attacker scores (:data:`PREFIX_SUITE_KEYS`); none for the others."""
    return PREFIX_SUITE_KEYS if get_attack_class(ALIASES.get(name, (name, {}))[0]).scoring == "prefixes" else ()


def grid_config(cfg: dict, seed: int) -> GridConfig:
    """The suite's ``[attacks]`` table as a :class:`GridConfig` (the suite's own dict is not modified)."""
    corpora = tuple(cfg.get("corpora", ["prose"]))
    names = tuple(cfg.get("attacks", ["linear-probe"]))
    options = {name: dict(opts) for name, opts in cfg.get("options", {}).items()}
    prefix, prefix_pii = 40, 96
    for name, opts in options.items():
        if suite_only_keys(name):
            prefix, prefix_pii = (int(opts.pop(k, d)) for k, d in zip(PREFIX_SUITE_KEYS, (prefix, prefix_pii)))
    return GridConfig(
        head_depths=tuple(cfg.get("head_depths", [2])), tail_layers=tuple(cfg.get("tail_depths", [])), corpora=corpora,
        attacks=names, options=options, train_tokens=cfg.get("train_tokens", 20000) // len(corpora),
        val_tokens=cfg.get("val_tokens", 0) // len(corpora), test_tokens=cfg.get("test_tokens", 2000) // len(corpora),
        max_length=cfg.get("max_length", 128), max_doc_tokens=cfg.get("max_doc_tokens"), prefix_tokens=prefix, prefix_pii_tokens=prefix_pii,
        wire_tokens=int(cfg.get("wire_tokens", 256)), seed=seed, victim=Victim(cfg.get("defense", "none")),
        scored_set=ScoredSetConfig.from_suite(cfg))


def _record(results: dict, run: str, metrics: dict) -> None:
    for name, m in metrics.items():
        if name in RECORDED or name.startswith("pii_recovery_"):
            add_metric(results, run, name, metric(m["value"], m["ci_low"], m["ci_high"], m["n"],
                                                  m["higher_is_better"], kind=m["kind"]))


def derived(rows: list[dict]) -> dict:
    """The report's PII rows (deepest head boundary; all) and the baselines of the first pooled row, from rows."""
    pii_rows = [{"attack": r["attack"], "boundary": r["boundary"], "depth": r["depth"],
                 "type": t[len("pii_recovery_"):], "value": v["value"], "n": v["n"]}
                for r in rows if r["corpus"] == "all" for t, v in r["metrics"].items() if t.startswith("pii_recovery_")]
    base = next((r["metrics"] for r in rows if r["corpus"] == "all"), {})
    baselines = {k.replace("baseline_", "").replace("_top1", ""): v["value"] for k, v in base.items()
                 if k.startswith("baseline_") and k.endswith("_top1")}
    # the PII plot shows the deepest head boundary tested
    heads = [r for r in pii_rows if Boundary.parse(r["boundary"]).side == "head"]
    deepest = max((r["depth"] for r in heads), default=None)
    plot_pii = [{**r, "title": f"PII spans recovered exactly, {r['boundary']}"} for r in heads
                if r["depth"] == deepest]
    return {"pii_rows": plot_pii, "pii_all": pii_rows, "baselines": baselines}


def stage_attacks(loaded: LoadedModel, cfg: dict, results: dict) -> dict:
    """Fit and score the suite's attacks at every boundary (this shard's jobs); returns rows for the report."""
    grid = grid_config(cfg, results["config"]["seed"])
    shard = Shard.of(results)
    t0 = time.perf_counter()
    data = extract(loaded, grid)
    extract_s = time.perf_counter() - t0
    rows, fitted, preds = [], {}, {}
    for j, job in enumerate(plan(grid, data.depth_of)):
        if not shard.mine(j):
            continue
        try:
            job_rows = [{**r, "job": j} for r in run_job(loaded, grid, data, job, fitted, preds)]
        except Exception as e:  # noqa: BLE001 - a failed component is left out and listed, never half-recorded
            why = droppable("attack", job.name, e)
            if why is None:
                raise
            record_failure(results, "attacks", "attack", f"{job.name}@{job.boundary}", why)
            continue
        rows += job_rows
        run = f"attacks/{job.name}/{job.boundary}"
        _record(results, run, job_rows[0]["metrics"])
        record_traffic(results, run, job_rows[0]["info"])
        if "seed_split_top1" in job_rows[0]["info"]:  # the seed's own number: random token-level split
            add_metric(results, run, "seed_split_top1", metric(
                job_rows[0]["info"]["seed_split_top1"], n=job_rows[0]["info"].get("seed_test_pairs"), kind="info"))
    for r in depth_rows(loaded, grid, data) if shard.first else []:
        run = f"attacks/{r['attack']}-{r['classifier']}/{r['boundary']}"
        add_metric(results, run, "depth_sequence_acc", metric(r["sequence_acc"], n=r["sequences"], kind="info"))
    return {"rows": rows, **derived(rows), "predictions": preds, "extract_seconds": extract_s,
            "pii_test": data.pii,
            "note": (f"Teacher-forced states of held-out test documents; attackers trained on "
                     f"{cfg.get('train_tokens', 20000)} training tokens of {', '.join(grid.corpora)} "
                     f"(document-level splits); prefix-scored attackers (vocab-match) on each head depth's common "
                     f"scored set alone ({grid.scored_set.user_tokens} user-text tokens from each of up to "
                     f"{grid.scored_set.docs_per_corpus} de-duplicated held-out documents per corpus, chat user turns "
                     f"included), every other head-side attacker on all test tokens and on that set (the common-set "
                     f"table and the summary compare attackers there); output-side attackers (leaks = output) on up "
                     f"to {grid.wire_tokens} tokens per "
                     "corpus generated by real split generation (wire taps, speculative drafts included), the "
                     "generated token as target; output-probe:current reads the token the body received from the "
                     f"states it returns: input-side leakage. {THREAT_NOTE}")}
