"""Harness stages that measure generation: exactness, throughput per split depth, RTT model.

Each stage takes the loaded model and its table of the suite, adds metrics to
the results document (:mod:`benchmarks.schema`) and returns raw rows that the
report and plots use.
"""

from __future__ import annotations

import logging
import statistics

from tqdm import tqdm

from benchmarks.exactness import PROMPTS as EXACT_PROMPTS
from benchmarks.exactness import compare, unsplit_reference
from benchmarks.prompts import PROMPTS as CATEGORY_PROMPTS
from benchmarks.schema import add_metric, metric
from splitinfer import timing as rtt_model
from splitinfer.client import SplitModel
from splitinfer.link import WanProfile
from splitinfer.models import LoadedModel
from splitinfer.partition import SplitConfig
from splitinfer.timing import StepTiming

log = logging.getLogger(__name__)


def _prompt_ids(sm: SplitModel, prompt: str) -> list[int]:
    return sm.encode_prompt(prompt, chat=sm.loaded.has_chat_template)


def stage_exactness(loaded: LoadedModel, cfg: dict, results: dict) -> list[dict]:
    """Greedy split generation (every decoding) vs the unsplit model, fp32 on the wire."""
    splits = cfg.get("splits", ["2,2"])
    decodings = cfg.get("decodings", ["sequential"])
    n, prompts = cfg.get("tokens", 32), EXACT_PROMPTS[: cfg.get("prompts", 2)]
    rows = []
    models = {s: SplitModel(loaded, s, wire_dtype="fp32") for s in splits}
    todo = [(p, s, d) for p in prompts for s in splits for d in decodings]
    refs: dict[str, tuple] = {}
    for prompt, split, dec in tqdm(todo, desc="exactness", unit="run"):
        sm = models[split]
        ids = _prompt_ids(sm, prompt)
        if prompt not in refs:
            refs[prompt] = unsplit_reference(loaded, ids, n)
        res = sm.generate(ids, n, record_logits=True, decoding=dec)
        rows.append({"split": split, "decoding": dec, "prompt": prompt,
                     **compare(res.token_ids, res.logits, *refs[prompt])})
    for split in splits:
        for dec in decodings:
            rs = [r for r in rows if r["split"] == split and r["decoding"] == dec]
            run = f"exactness/{dec}/split={split}"
            add_metric(results, run, "identical_share", metric(
                sum(r["identical"] for r in rs) / len(rs), n=len(rs), kind="exact"))
            add_metric(results, run, "max_logit_diff", metric(
                max(r["max_logit_diff"] for r in rs), n=len(rs), higher_is_better=False, kind="info"))
            add_metric(results, run, "within_1e-4", metric(
                all(r["max_logit_diff"] <= 1e-4 for r in rs), n=len(rs), kind="exact"))
    return rows


def _category_prompts(cfg: dict) -> list[tuple[str, str]]:
    cats = cfg.get("categories", list(CATEGORY_PROMPTS))
    k = cfg.get("prompts_per_category", 1)
    return [(c, p) for c in cats for p in CATEGORY_PROMPTS[c][:k]]


def _measure(sm: SplitModel, prompts: list[tuple[str, str]], n: int, decoding: str,
             options: dict | None = None) -> list[dict]:
    """Generate each prompt; ``options`` (the suite's ``decoding_options[decoding]``) configure the proposer.

    Proposers that adapt to measured step times (``combined``) are given a fixed cost model in the
    suites, so greedy tau is reproducible and can be compared exactly against a baseline.
    """
    out = []
    for cat, prompt in prompts:
        res = sm.generate(_prompt_ids(sm, prompt), n, decoding=decoding, decoding_options=options)
        out.append({"category": cat, "tokens": len(res.token_ids), "steps": res.steps,
                    "tau": res.tokens_per_step})
    return out


def _decode_steps(runs: list[dict]) -> list[StepTiming]:
    return [s for r in runs for s in r["steps"][1:]]


def _spread(model, steps: list[StepTiming], chunk: int = 8) -> tuple[float, float]:
    """Min and max of measured / modelled tok/s over consecutive ``chunk``-step blocks: the run's own spread
    (regress widens its tolerance for this metric to it)."""
    ratios = []
    for i in range(0, len(steps) - chunk + 1, chunk):
        block = steps[i : i + chunk]
        ms = sum(s.total_ms for s in block)
        if ms > 0 and model.tok_s(block) > 0:
            ratios.append(1e3 * sum(s.tokens_committed for s in block) / ms / model.tok_s(block))
    return (min(ratios), max(ratios)) if ratios else (float("inf"), float("-inf"))


def stage_speed(loaded: LoadedModel, cfg: dict, results: dict) -> list[dict]:
    """tok/s, tau and step breakdown per head depth x decoding x RTT; efficiency = measured / modelled."""
    tail = cfg.get("tail_layers", 2)
    bw = float(cfg.get("bandwidth_mbps", 100.0))
    rtts = [float(r) for r in cfg.get("rtt_ms", [20, 80])]
    n = cfg.get("tokens", 32)
    prompts = _category_prompts(cfg)
    rows = []
    jobs = [(a, d) for a in cfg.get("head_depths", [2]) for d in cfg.get("decodings", ["sequential"])]
    for a, dec in tqdm(jobs, desc="speed", unit="config"):
        split = SplitConfig(a, tail)
        per_rtt = {}
        for rtt in rtts:
            sm = SplitModel(loaded, split, wan=WanProfile(rtt_ms=rtt, bandwidth_mbps=bw),
                            wire_dtype=cfg.get("wire_dtype", "fp16"))
            per_rtt[rtt] = _measure(sm, prompts, n, dec, cfg.get("decoding_options", {}).get(dec))
        model = rtt_model.fit_pooled({r: _decode_steps(v) for r, v in per_rtt.items()}, bw)
        for rtt, runs in per_rtt.items():
            steps = _decode_steps(runs)
            ms = sum(s.total_ms for s in steps)
            toks = sum(s.tokens_committed for s in steps)
            measured = 1e3 * toks / ms
            modelled = rtt_model.modelled_tok_s(model, steps, rtt, bw)
            tau = sum(r["tokens"] for r in runs) / sum(len(r["steps"]) for r in runs)
            row = {"head_layers": a, "tail_layers": tail, "decoding": dec, "rtt_ms": rtt, "bandwidth_mbps": bw,
                   "tok_s_measured": measured, "tok_s_modelled": modelled, "efficiency": measured / modelled,
                   "tau": tau, "tau_by_category": {}, "bytes_per_step": statistics.mean(
                       s.bytes_up + s.bytes_down for s in steps),
                   "tokens_sent_per_step": statistics.mean(s.tokens_sent for s in steps),
                   "breakdown_ms": {k: statistics.mean(getattr(s, k) for s in steps) for k in
                                    ("head_ms", "body_ms", "tail_ms", "codec_ms", "network_ms", "draft_ms",
                                     "other_ms", "total_ms")},
                   "tok_s_modelled_flat": rtt_model.modelled_tok_s(model, steps, rtt, bw, flat=True)}
            for cat in {r["category"] for r in runs}:
                rc = [r for r in runs if r["category"] == cat]
                row["tau_by_category"][cat] = sum(r["tokens"] for r in rc) / sum(len(r["steps"]) for r in rc)
            rows.append(row)
            run = f"speed/{dec}/split={a},{tail}/rtt={rtt:g}"
            add_metric(results, run, "tau", metric(tau, n=toks, kind="exact", unit="tokens/step"))
            lo, hi = _spread(model.project(rtt, bw), steps)
            add_metric(results, run, "efficiency", metric(measured / modelled, min(lo, measured / modelled),
                                                          max(hi, measured / modelled), n=len(steps),
                                                          kind="efficiency"))
            add_metric(results, run, "tok_s_measured", metric(measured, n=len(steps), kind="info", unit="tok/s"))
            add_metric(results, run, "tok_s_modelled", metric(modelled, n=len(steps), kind="info", unit="tok/s"))
    return rows


def stage_rtt_model(loaded: LoadedModel, cfg: dict, results: dict) -> dict:
    """Fit the step-time model at several RTTs; leave-one-RTT-out CV error; projections."""
    split = SplitConfig.parse(cfg.get("split", "2,2"))
    bw = float(cfg.get("bandwidth_mbps", 100.0))
    n = cfg.get("tokens", 24)
    prompts = [(c, p) for c, ps in CATEGORY_PROMPTS.items() for p in ps[:1]][: cfg.get("prompts", 2)]
    out = {}
    jobs = [(d, float(r)) for d in cfg.get("decodings", ["sequential"]) for r in cfg.get("rtt_ms", [0, 20, 80])]
    runs: dict[str, dict[float, list[StepTiming]]] = {}
    for dec, rtt in tqdm(jobs, desc="rtt model", unit="run"):
        sm = SplitModel(loaded, split, wan=WanProfile(rtt_ms=rtt, bandwidth_mbps=bw))
        runs.setdefault(dec, {})[rtt] = _decode_steps(
            _measure(sm, prompts, n, dec, cfg.get("decoding_options", {}).get(dec)))
    for dec, by_rtt in runs.items():
        cv = rtt_model.leave_one_rtt_out(by_rtt, bw)
        model = rtt_model.fit_pooled(by_rtt, bw)
        steps = [s for v in by_rtt.values() for s in v]
        proj = rtt_model.projections(model, steps, cfg.get("project_rtt_ms", [5, 20, 50, 80, 100, 150]),
                                     [bw, 1000.0])
        measured = [{"rtt_ms": r, "tok_s": 1e3 * sum(s.tokens_committed for s in v) / sum(s.total_ms for s in v)}
                    for r, v in sorted(by_rtt.items())]
        curve = rtt_model.projections(model, steps, list(range(0, 155, 5)), [bw])
        out[dec] = {"cv": cv, "model": model.to_dict(), "seed_model": rtt_model.seed_model_fit(by_rtt),
                    "projections": proj, "curve": curve, "measured": measured, "split": str(split)}
        run = f"rtt_model/{dec}/split={split}"
        add_metric(results, run, "loo_rtt_mean_rel_error", metric(
            cv["mean_rel_error"], n=len(cv["folds"]), higher_is_better=False, kind="info"))
        add_metric(results, run, "loo_rtt_max_rel_error", metric(
            cv["max_rel_error"], n=len(cv["folds"]), higher_is_better=False, kind="info"))
    return out
