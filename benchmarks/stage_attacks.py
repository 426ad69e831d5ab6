"""Harness stage: inversion attacks per split depth (issue 6's attackers inside a suite).

For every boundary (``head:A`` for the states the cloud receives, ``tail:B``
for those it returns) it extracts teacher-forced taps of the train and test
splits of each corpus (one truncated forward for all boundaries), fits each
attack the boundary admits on the pooled training taps, scores it on the
pooled held-out test documents (95% bootstrap CIs over documents) and per
corpus, and records PII recovery by type. ``vocab-match`` (white-box) is
scored on whole-sequence prefixes of the test documents (``scored_tokens``
per corpus plus ``pii_tokens`` of two PII sequences: ``scoring_subset``),
with the linear probe of the same boundary ordering its candidates when that
probe ran.
"""

from __future__ import annotations

import logging
import time

import numpy as np
from tqdm import tqdm

from attacks.evaluate import collect, doc_top1_counts, prior_from_taps, score
from attacks.recipes.vocab_match import scoring_subset
from attacks.registry import get_attack_class, make_attack
from attacks.tapdata import Taps
from attacks.taps import extract_depths
from benchmarks.schema import add_metric, metric
from splitinfer.models import LoadedModel

log = logging.getLogger(__name__)

# suite names that are a recipe with fixed options
ALIASES = {"mlp-seed": ("mlp", {"protocol": "seed"})}
LEARNED_ORDER = ("linear-probe", "linear-embed", "mlp", "seq-decoder", "output-probe")
RECORDED = ("token_acc_top1", "token_acc_top5", "token_f1", "exact_match", "template_token_acc_top1", "coverage",
            "baseline_position_top1", "baseline_unigram_top1", "lift_token_acc_top1", "lift_exact_match")


def _extract(loaded: LoadedModel, cfg: dict, boundaries: list[str]) -> tuple[dict, dict, dict]:
    corpora = cfg.get("corpora", ["prose"])
    per_train = cfg.get("train_tokens", 20000) // len(corpora)
    per_test = cfg.get("test_tokens", 2000) // len(corpora)
    train: dict[str, list[Taps]] = {b: [] for b in boundaries}
    test: dict[str, list[Taps]] = {b: [] for b in boundaries}
    spans: dict[str, dict[str, tuple[int, int]]] = {b: {} for b in boundaries}  # corpus -> rows in test
    for corpus in tqdm(corpora, desc="attack taps", unit="corpus"):
        for split, n, dest in (("train", per_train, train), ("test", per_test, test)):
            taps = extract_depths(loaded, corpus, boundaries, split, max_tokens=n,
                                  max_length=cfg.get("max_length", 128), progress=False)
            if split == "test" and len(set(taps[boundaries[0]].seq_doc.tolist())) < 10:  # >= 10 test documents
                taps = extract_depths(loaded, corpus, boundaries, split, max_tokens=n, max_doc_tokens=max(1, n // 10),
                                      max_length=cfg.get("max_length", 128), progress=False)
            for b, t in taps.items():
                if split == "test":
                    start = sum(x.n_tokens for x in dest[b])
                    spans[b][corpus] = (start, start + t.n_tokens)
                dest[b].append(t)
    return ({b: Taps.concat(v) for b, v in train.items()}, {b: Taps.concat(v) for b, v in test.items()}, spans)


def _record(results: dict, run: str, metrics: dict) -> None:
    for name, m in metrics.items():
        if name in RECORDED or name.startswith("pii_recovery_"):
            add_metric(results, run, name, metric(m["value"], m["ci_low"], m["ci_high"], m["n"],
                                                  m["higher_is_better"], kind=m["kind"]))


def stage_attacks(loaded: LoadedModel, cfg: dict, results: dict) -> dict:
    """Fit and score the suite's attacks at every boundary; returns rows for the report."""
    L = loaded.num_layers
    boundaries = [f"head:{a}" for a in cfg.get("head_depths", [2])] + \
                 [f"tail:{b}" for b in cfg.get("tail_depths", [])]
    t0 = time.perf_counter()
    train, test, corpus_rows = _extract(loaded, cfg, boundaries)
    extract_s = time.perf_counter() - t0
    options = {name: dict(opts) for name, opts in cfg.get("options", {}).items()}  # copies: the suite is recorded
    vm_opts = options.setdefault("vocab-match", {})
    vm_tokens, vm_pii = int(vm_opts.pop("scored_tokens", 40)), int(vm_opts.pop("pii_tokens", 96))
    names = cfg.get("attacks", ["linear-probe"])
    rows, pii_rows, preds = [], [], {}
    vocab = int(loaded.config.vocab_size)
    jobs = [(b, n) for b in boundaries for n in sorted(names, key=lambda n: (n not in LEARNED_ORDER, n))]
    fitted: dict[tuple[str, str], object] = {}
    for b, name in tqdm(jobs, desc="attacks", unit="fit"):
        side, k = b.split(":")
        recipe, fixed = ALIASES.get(name, (name, {}))
        cls = get_attack_class(recipe)
        if cls.boundary_side not in (side, "any"):
            continue
        depth = int(k) if side == "head" else L - int(k)
        atk = make_attack(recipe, model=loaded, seed=results["config"]["seed"], **{**options.get(name, {}), **fixed})
        if name == "vocab-match" and (b, "linear-probe") in fitted:
            atk.set_proposer(fitted[(b, "linear-probe")])
        t_fit = time.perf_counter()
        atk.fit(train[b])
        fit_s = time.perf_counter() - t_fit
        fitted[(b, name)] = atk
        subset = name == "vocab-match"
        target = scoring_subset(test[b], corpus_rows[b], vm_tokens, vm_pii) if subset else test[b]
        t_inv = time.perf_counter()
        inv = atk.invert(target, k=5)
        inv_s = time.perf_counter() - t_inv
        prior = prior_from_taps(train[b])
        pred = collect(inv, target, vocab_size=vocab, prior=prior, meta={"attack": name, "boundary": b})
        m, preds[f"attacks/{name}/{b}"] = pred.summarize(), pred
        row = {"attack": name, "threat_model": cls.threat_model, "side": side, "depth": depth, "boundary": b,
               "corpus": "all", "metrics": m, "seconds_per_token": inv_s / max(1, target.n_tokens),
               "fit_seconds": fit_s, "train_tokens": train[b].n_tokens, "test_tokens": target.n_tokens,
               "info": {k: v for k, v in {**atk.fit_report, **inv.info}.items() if isinstance(v, (int, float, str))},
               "doc_top1": doc_top1_counts(pred)}
        rows.append(row)
        _record(results, f"attacks/{name}/{b}", m)
        if "seed_split_top1" in atk.fit_report:  # the seed's own number: random token-level split of ~880 pairs
            add_metric(results, f"attacks/{name}/{b}", "seed_split_top1", metric(
                atk.fit_report["seed_split_top1"], n=atk.fit_report.get("seed_test_pairs"), kind="info"))
        for t, v in m.items():
            if t.startswith("pii_recovery_"):
                pii_rows.append({"attack": name, "boundary": b, "depth": depth, "type": t[len("pii_recovery_"):],
                                 "value": v["value"], "n": v["n"]})
        if not subset:  # per-corpus breakdown of the same inversion
            for corpus, (lo, hi) in corpus_rows[b].items():
                sub = np.arange(lo, hi)
                sm = score(_slice(inv, sub), test[b], rows=sub, vocab_size=vocab, prior=prior)
                rows.append({**row, "corpus": corpus, "metrics": sm, "test_tokens": hi - lo})
    base = next((r["metrics"] for r in rows if r["corpus"] == "all"), {})
    baselines = {k.replace("baseline_", "").replace("_top1", ""): v["value"] for k, v in base.items()
                 if k.startswith("baseline_") and k.endswith("_top1")}  # user text
    # the PII plot shows the deepest head boundary tested
    deepest = max((r["depth"] for r in pii_rows if r["boundary"].startswith("head")), default=None)
    plot_pii = [{**r, "title": f"PII spans recovered exactly, {r['boundary']}"} for r in pii_rows
                if r["depth"] == deepest and r["boundary"].startswith("head")]
    return {"rows": rows, "pii_rows": plot_pii, "pii_all": pii_rows, "baselines": baselines, "predictions": preds,
            "extract_seconds": extract_s,
            "note": (f"Teacher-forced states of held-out test documents; attackers trained on "
                     f"{cfg.get('train_tokens', 20000)} training tokens of {', '.join(cfg.get('corpora', []))} "
                     f"(document-level splits); vocab-match scored on sequence prefixes: "
                     f"{vm_tokens} tokens per corpus plus {vm_pii} tokens of two PII sequences. "
                     "white-box = holds the local layers' published weights; shadow = trains on its own pairs "
                     "from the public model and an auxiliary corpus.")}


def _slice(inv, rows: np.ndarray):
    from attacks.base import Inversion

    return Inversion(inv.tokens[rows], inv.topk[rows], inv.scores[rows])
