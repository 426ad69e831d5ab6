"""Per-depth inversion study (issue 6): every attacker at every split depth of one model, JSON + Markdown.

For head depths A (the states the cloud receives, ``head:A``) and output-side
depths L-B (the states it returns to a B-layer tail, ``tail:B``), taps of the
train, val and test splits of every corpus are extracted in ONE truncated
forward per corpus and split (:func:`attacks.taps.extract_depths`). Every
attacker is fitted on the pooled training taps of a boundary and scored on the
pooled held-out test documents (95% bootstrap CIs over documents), with PII
recovery per type. The seed's MLP protocol (about 880 pairs, random token-level
split) runs beside the proper one. ``vocab-match`` tries the same boundary's
``linear-probe`` top-k first (:data:`JOB_HELPERS`) and is scored on the first
tokens of the first four test sequences of each corpus (``vocab_match_tokens``
per corpus; prefixes are valid inputs since sequences start at position 0),
with longer prefixes (``vocab_match_pii_tokens``) for two sequences of PII
corpora so that PII recovery is scored, and reports seconds per token. ``depth-id`` is trained on the training taps of all
depths and scored per depth. The sizes are CPU defaults (the whole study in
about 20 minutes on two shared cores); :class:`StudyConfig` makes them
configurable (``splitinfer bench attacks --help``) for machines with GPUs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attacks.evaluate import collect, doc_top1_counts, prior_from_taps
from attacks.predictions import write_all
from attacks.recipes.vocab_match import scoring_subset
from attacks.registry import get_attack_class, make_attack
from attacks.tapdata import Taps
from attacks.taps import extract_depths

log = logging.getLogger(__name__)

SEED_MLP_TOP1 = {1: 0.588, 3: 0.443, 7: 0.348}  # Cunningham (2026), Mistral-7B, after layer N
HEAD_ATTACKS = ("linear-probe", "linear-embed", "mlp", "mlp-seed", "seq-decoder", "vocab-match")
TAIL_ATTACKS = ("output-probe",)
ALIASES = {"mlp-seed": ("mlp", {"protocol": "seed"})}
PARTIAL_NAME = "attacks_depth.partial.jsonl"
JOB_HELPERS = {"vocab-match": ("linear-probe",)}  # attacks whose fitted model another job uses (set_proposer)


@dataclass(frozen=True)
class StudyConfig:
    """Sizes of the per-depth study (defaults: CPU budget of about 20 minutes on two shared cores)."""

    model: str = "default"
    head_depths: tuple[int, ...] = (1, 2, 4, 8, 12, 16)
    tail_layers: tuple[int, ...] = (2, 4, 8)  # output-side depths L-2, L-4, L-8
    corpora: tuple[str, ...] = ("prose", "code", "chat", "pii")
    train_tokens: int = 3000  # per corpus
    val_tokens: int = 400  # per corpus
    test_tokens: int = 1000  # per corpus
    max_length: int = 128
    max_doc_tokens: int = 128  # tokens kept per document, so small budgets still span many documents
    vocab_match_tokens: int = 40  # per corpus: the first tokens of its first 4 test sequences
    vocab_match_pii_tokens: int = 96  # PII corpora: their first 2 test sequences are cut here instead
    vocab_match_depths: tuple[int, ...] | None = None  # head depths where vocab-match runs (None = all)
    attacks: tuple[str, ...] = HEAD_ATTACKS + TAIL_ATTACKS + ("depth-id",)
    hparams: dict[str, dict[str, Any]] = field(default_factory=lambda: {
        "linear-probe": {"epochs": 6}, "mlp": {"epochs": 2}, "mlp-seed": {"seed_epochs": 30},
        "seq-decoder": {"epochs": 8}, "output-probe": {"epochs": 6}, "depth-id": {"epochs": 3},
        "vocab-match": {"random_tokens": 4096}})
    seed: int = 0
    n_boot: int = 1000
    device: str = "cpu"


def _pool(loaded: Any, cfg: StudyConfig, boundaries: list[str], split: str, per_corpus: int) -> tuple[dict, dict]:
    """{boundary: pooled Taps} and {corpus: (first row, end row)} for one split."""
    parts: dict[str, list[Taps]] = {b: [] for b in boundaries}
    rows: dict[str, tuple[int, int]] = {}
    for corpus in cfg.corpora:
        taps = extract_depths(loaded, corpus, boundaries, split, max_tokens=per_corpus, max_length=cfg.max_length,
                              max_doc_tokens=min(cfg.max_doc_tokens, max(1, per_corpus // 10)) if split == "test"
                              else cfg.max_doc_tokens, seed=cfg.seed, progress=False)  # >= 10 test docs per corpus
        start = sum(t.n_tokens for t in parts[boundaries[0]])
        rows[corpus] = (start, start + taps[boundaries[0]].n_tokens)
        for b, t in taps.items():
            parts[b].append(t)
    return {b: Taps.concat(v) for b, v in parts.items()}, rows


def _entry(name: str, cls: Any, boundary: str, depth: int, m: dict, fit_s: float, inv_s: float, n: int,
           extra: dict) -> dict[str, Any]:
    return {"attack": name, "threat_model": cls.threat_model, "boundary": boundary, "depth": depth, "metrics": m,
            "fit_seconds": round(fit_s, 2), "invert_seconds": round(inv_s, 2), "seconds_per_token": inv_s / max(n, 1),
            "test_tokens": n, **extra}


def job_key(cfg: StudyConfig, job: str) -> str:
    """What one (attack, boundary) job's result depends on: the shared sizes and seeds plus its own options.

    Neither the selection of attacks (``attacks``, ``vocab_match_depths``) nor the other attacks' options is
    part of it, so a rerun with fewer or more attacks, or with one attack's options changed, reuses every
    other finished job. The code version is not part of it either: after changing an attack's code, delete
    the partial file of an interrupted run (a finished run deletes its own).
    """
    shared = {k: v for k, v in asdict(cfg).items() if k not in ("attacks", "hparams", "vocab_match_depths")}
    hparams = {j: cfg.hparams.get(j, {}) for j in (job, *JOB_HELPERS.get(job, ()))}
    text = json.dumps({**shared, "job": job, "hparams": hparams if len(hparams) > 1 else hparams[job]},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _load_partial(path: Path | None, cfg: StudyConfig) -> dict[tuple[str, str], list[dict]]:
    """Rows already computed by an interrupted run with the same job configuration: {(attack, boundary): rows}."""
    done: dict[tuple[str, str], list[dict]] = {}
    if path is None or not path.is_file():
        return done
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut by the interruption
        if rec.get("key") == job_key(cfg, rec.get("job", "")):
            done[(rec["job"], rec["boundary"])] = rec["rows"]
    if done:
        log.info("resuming: %d finished (attack, boundary) jobs from %s", len(done), path)
    return done


def run_study(cfg: StudyConfig, progress: bool = True, partial: str | Path | None = None) -> dict[str, Any]:
    """Run the study; returns ``{"config", "rows", "depth_id", "timing", ...}`` (see :func:`to_results`).

    ``partial``: a JSONL file where each finished (attack, boundary) job is appended; a rerun skips the jobs
    found there whose configuration (:func:`job_key`) is unchanged (the study resumes after an interruption).
    """
    import torch
    from tqdm.auto import tqdm

    from splitinfer.models import load_model

    t_start = time.perf_counter()
    partial = Path(partial) if partial is not None else None
    done = _load_partial(partial, cfg)
    loaded = load_model(cfg.model, device=cfg.device)
    L = loaded.num_layers
    heads = [f"head:{a}" for a in cfg.head_depths]
    tails = [f"tail:{b}" for b in cfg.tail_layers]
    boundaries = heads + tails
    depth_of = {b: (int(b[5:]) if b.startswith("head") else L - int(b[5:])) for b in boundaries}
    t0 = time.perf_counter()
    train, _ = _pool(loaded, cfg, boundaries, "train", cfg.train_tokens)
    val, _ = _pool(loaded, cfg, boundaries, "val", cfg.val_tokens)
    test, test_rows = _pool(loaded, cfg, boundaries, "test", cfg.test_tokens)
    extract_s = time.perf_counter() - t0
    log.info("taps ready in %.0f s: %d train, %d val, %d test tokens per boundary", extract_s,
             train[heads[0]].n_tokens, val[heads[0]].n_tokens, test[heads[0]].n_tokens)
    vocab = int(loaded.config.vocab_size)
    rows: list[dict[str, Any]] = []
    preds: dict[str, Any] = {}  # run -> per-token predictions (not kept for jobs resumed from the partial file)
    fitted: dict[tuple[str, str], Any] = {}  # (boundary, attack) -> fitted helper (JOB_HELPERS)
    jobs = [(b, a) for b in boundaries for a in cfg.attacks if a != "depth-id"]
    for b, name in tqdm(jobs, desc="attacks", unit="fit", disable=not progress):
        recipe, fixed = ALIASES.get(name, (name, {}))
        cls = get_attack_class(recipe)
        if cls.boundary_side not in (b.split(":")[0], "any"):
            continue
        if name == "vocab-match" and cfg.vocab_match_depths is not None and depth_of[b] not in cfg.vocab_match_depths:
            continue
        if (name, b) in done:
            rows += done[(name, b)]
            continue
        first_row = len(rows)
        torch.manual_seed(cfg.seed)
        atk = make_attack(recipe, model=loaded, seed=cfg.seed, **{**cfg.hparams.get(name, {}), **fixed})
        for helper in JOB_HELPERS.get(name, ()):  # its top-k goes first (fitted now if its own job was resumed)
            if (b, helper) not in fitted:
                torch.manual_seed(cfg.seed)  # the same model as its own job fits
                fitted[(b, helper)] = make_attack(helper, model=loaded, seed=cfg.seed,
                                                  **cfg.hparams.get(helper, {})).fit(train[b], val[b])
                torch.manual_seed(cfg.seed)
            atk.set_proposer(fitted[(b, helper)])
        t = time.perf_counter()
        atk.fit(train[b], val[b])
        fit_s = time.perf_counter() - t
        if any(name in helpers for helpers in JOB_HELPERS.values()):
            fitted[(b, name)] = atk
        prior = prior_from_taps(train[b])
        targets = ("both", "next", "current") if name == "output-probe" else (None,)
        data = (scoring_subset(test[b], test_rows, cfg.vocab_match_tokens, cfg.vocab_match_pii_tokens)
                if name == "vocab-match" else test[b])
        for target in targets:
            t = time.perf_counter()
            inv = atk.invert(data, target=target) if target else atk.invert(data)
            inv_s = time.perf_counter() - t
            label = f"{name}:{target}" if target else name
            pred = collect(inv, data, vocab_size=vocab, prior=prior, n_boot=cfg.n_boot, seed=cfg.seed,
                           meta={"attack": label, "boundary": b})
            m, preds[f"attacks/{label}/{b}"] = pred.summarize(), pred
            per_corpus = {}
            if name != "vocab-match":
                for corpus, (lo, hi) in test_rows.items():
                    sub = np.arange(lo, hi)
                    per_corpus[corpus] = float((inv.tokens[sub] == data.token_ids[sub]).mean())
            info = {k: v for k, v in {**atk.fit_report, **inv.info}.items() if isinstance(v, (int, float, str))}
            rows.append(_entry(label, cls, b, depth_of[b], m, fit_s, inv_s, data.n_tokens,
                               {"per_corpus_top1": per_corpus, "info": info, "train_tokens": train[b].n_tokens,
                                "doc_top1": doc_top1_counts(pred)}))
            log.info("%s at %s: top-1 %.3f (%.1f s fit, %.1f s invert)", label, b, m["token_acc_top1"]["value"],
                     fit_s, inv_s)
        if partial is not None:
            partial.parent.mkdir(parents=True, exist_ok=True)
            with partial.open("a", encoding="utf-8") as f:
                rec = {"key": job_key(cfg, name), "job": name, "boundary": b, "rows": rows[first_row:]}
                f.write(json.dumps(rec) + "\n")
    depth_rows = []
    if "depth-id" in cfg.attacks:
        t = time.perf_counter()
        did = make_attack("depth-id", model=loaded, seed=cfg.seed, **cfg.hparams.get("depth-id", {}))
        did.fit([train[b] for b in boundaries])
        for b in boundaries:
            for clf in ("stats", "raw"):
                pred = did.identify(test[b], classifier=clf)
                depth_rows.append({"boundary": b, "depth": depth_of[b], "classifier": clf,
                                   "token_acc": float((pred["token_depth"] == depth_of[b]).mean()),
                                   "sequence_acc": float((pred["sequence_depth"] == depth_of[b]).mean()),
                                   "sequences": len(test[b])})
        log.info("depth-id done in %.0f s", time.perf_counter() - t)
    return {"config": {**asdict(cfg), "model_sha256": loaded.sha256, "num_layers": L, "vocab_size": vocab,
                       "train_tokens_total": train[heads[0]].n_tokens, "val_tokens_total": val[heads[0]].n_tokens,
                       "test_tokens_total": test[heads[0]].n_tokens,
                       "test_documents": len(set(test[heads[0]].seq_doc.tolist())),
                       "threads": torch.get_num_threads()},
            "rows": rows, "depth_id": depth_rows, "predictions": preds,
            "timing": {"extract_seconds": round(extract_s, 1),
                       "total_seconds": round(time.perf_counter() - t_start, 1), "resumed_jobs": len(done)}}


def to_results(study: dict[str, Any]) -> dict[str, Any]:
    """A results document (:mod:`benchmarks.schema`) holding every metric, plus the raw rows."""
    from benchmarks.schema import add_metric, metric, new_results

    cfg = study["config"]
    results = new_results({"model": cfg["model"], "model_sha256": cfg["model_sha256"], "corpus": cfg["corpora"],
                           "split": "train/val/test by document", "seed": cfg["seed"], "study": cfg}, "attacks-depth")
    for r in study["rows"]:
        run = f"attacks/{r['attack']}/{r['boundary']}"
        for name, m in r["metrics"].items():
            add_metric(results, run, name, metric(m["value"], m["ci_low"], m["ci_high"], m["n"], True, kind=m["kind"]))
        add_metric(results, run, "seconds_per_token", metric(r["seconds_per_token"], n=r["test_tokens"],
                                                              higher_is_better=False, kind="info", unit="s"))
        if "seed_split_top1" in r["info"]:
            add_metric(results, run, "seed_split_top1", metric(r["info"]["seed_split_top1"],
                                                               n=r["info"].get("seed_test_pairs"), kind="info"))
    for r in study["depth_id"]:
        run = f"attacks/depth-id-{r['classifier']}/{r['boundary']}"
        add_metric(results, run, "depth_token_acc", metric(r["token_acc"], kind="info"))
        add_metric(results, run, "depth_sequence_acc", metric(r["sequence_acc"], n=r["sequences"], kind="info"))
    results["rows"] = study["rows"]
    results["depth_id"] = study["depth_id"]
    results["timing"] = study["timing"]
    return results


def write_outputs(study: dict[str, Any], out: str | Path) -> tuple[Path, Path]:
    """Write ``attacks_depth.json`` (schema-valid results + rows) and ``attacks_depth.md`` under ``out``."""
    from benchmarks.attacks_depth_report import markdown
    from benchmarks.schema import save

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_all(study.pop("predictions", {}), out)
    path_json = save(to_results(study), out / "attacks_depth.json")
    (out / PARTIAL_NAME).unlink(missing_ok=True)
    path_md = out / "attacks_depth.md"
    path_md.write_text(markdown(study), encoding="utf-8")
    return path_json, path_md
