"""Per-depth inversion study (issue 6): every attacker at every split depth of one model, JSON + Markdown.

The study is the attack grid (:mod:`benchmarks.attack_grid`, shared with the
suite's attack stage) at study sizes: head depths A (``head:A``, the states
the cloud receives) and output-side depths L-B (``tail:B``, the states it
returns), train / val / test splits of every corpus extracted in one
truncated forward per corpus and split; every attacker fitted on the pooled
training taps of a boundary (validation on the val split) and scored on the
pooled held-out test documents (95% bootstrap CIs over documents), with PII
recovery per type. The seed's MLP protocol (``mlp-seed``, about 880 pairs,
random token-level split) runs beside the proper one. ``vocab-match`` tries
the boundary's ``linear-probe`` top-k first and is scored on the first tokens
of the first four test sequences of each corpus (``vocab_match_tokens`` per
corpus), with longer prefixes (``vocab_match_pii_tokens``) for two sequences
of PII corpora. Output-side attackers (``output-probe``, ``tail-logits``) are
scored on the generated tokens of real split generation (``wire_tokens`` per
corpus); ``output-probe:current`` reads the token the body received: input
side. ``depth-id`` is trained on the training taps of all depths and scored
per depth. The sizes are CPU defaults; :class:`StudyConfig` makes them
configurable (``splitinfer bench attacks --help``) for machines with GPUs.

Training variance (issue 14 item 6): every learned attacker is fitted once
per seed of ``train_seeds`` on the same data; the first seed's rows are the
tables' rows (``attacks/NAME/BOUNDARY``), the others go to
``attacks/NAME/BOUNDARY/seed-S`` and the report shows the mean and the spread
across seeds. The PII corpus's test split is sized so that every span type
has ``min_pii_spans`` scored spans (:func:`benchmarks.attack_grid.pii_test_tokens`).

Resume: each finished (attacker, boundary, seed) job is appended to a partial
file under its key (:func:`benchmarks.attack_grid.job_key`: every input and a
hash of the trainer and recipe sources) and its per-token predictions are
written at once under ``predictions/``, so a rerun after an interruption
redoes only the jobs whose inputs or code changed or whose predictions file
is missing; every job of the finished study has its predictions.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from attacks.boundary import Boundary
from attacks.predictions import predictions_path, write_all
from attacks.registry import get_attack_class
from benchmarks.attack_grid import ALIASES, GridConfig, depth_rows, extract, job_key, plan, run_job
from benchmarks.attack_seeds import seed_spread
from splitinfer.errors import SplitInferError

log = logging.getLogger(__name__)

HEAD_ATTACKS = ("linear-probe", "linear-embed", "mlp", "mlp-seed", "seq-decoder", "vocab-match")
TAIL_ATTACKS = ("output-probe", "output-probe:current", "tail-logits")
PARTIAL_NAME = "attacks_depth.partial.jsonl"


@dataclass(frozen=True)
class StudyConfig:
    """Sizes of the per-depth study.

    Defaults: sized for about 30 minutes on two shared cores, an estimate from the per-job times of the
    6-depth, one-seed run of commit bd7a73d (learned attackers about 170 s per head depth and seed once the test
    set holds 40 spans of every PII type; vocab-match 0.02 / 0.1 / 0.5 s per token at head depths 1 / 8 / 16),
    not a measurement of this configuration. Depths 2, 4 and 12 and tails 4 and 8 run with
    ``--head-depths 1,2,4,8,12,16 --tail-layers 2,4,8`` (about 50 minutes by the same estimate).
    """

    model: str = "default"
    head_depths: tuple[int, ...] = (1, 8, 16)
    tail_layers: tuple[int, ...] = (2,)  # output-side depth L-2
    corpora: tuple[str, ...] = ("prose", "code", "chat", "pii")
    train_tokens: int = 3000  # per corpus
    val_tokens: int = 400  # per corpus
    test_tokens: int = 1000  # per corpus
    max_length: int = 128
    max_doc_tokens: int = 128  # tokens kept per document, so small budgets still span many documents
    vocab_match_tokens: int = 40  # per corpus: the first tokens of its first 4 test sequences
    vocab_match_pii_tokens: int = 96  # PII corpora: their first 2 test sequences are cut here instead
    vocab_match_depths: tuple[int, ...] | None = None  # head depths where vocab-match runs (None = all)
    wire_tokens: int = 256  # generated tokens per corpus scoring the output-side attackers
    attacks: tuple[str, ...] = HEAD_ATTACKS + TAIL_ATTACKS + ("depth-id",)
    hparams: dict[str, dict[str, Any]] = field(default_factory=lambda: {
        "linear-probe": {"epochs": 6}, "mlp": {"epochs": 2}, "mlp-seed": {"seed_epochs": 30},
        "seq-decoder": {"epochs": 8}, "output-probe": {"epochs": 6}, "output-probe:current": {"epochs": 6},
        "depth-id": {"epochs": 3}, "vocab-match": {"random_tokens": 4096}})
    min_pii_spans: int = 40  # the PII test split holds at least this many scored spans of every type
    seed: int = 0  # data: corpus splits and sampling
    train_seeds: tuple[int, ...] = (0, 1, 2)  # learned attackers fitted once per seed; the first one's rows tabled
    n_boot: int = 1000
    device: str = "cpu"


def grid_config(cfg: StudyConfig) -> GridConfig:
    """The study as an attack grid."""
    return GridConfig(head_depths=cfg.head_depths, tail_layers=cfg.tail_layers, corpora=cfg.corpora,
                      attacks=cfg.attacks, options=cfg.hparams, train_tokens=cfg.train_tokens,
                      val_tokens=cfg.val_tokens, test_tokens=cfg.test_tokens, max_length=cfg.max_length,
                      max_doc_tokens=cfg.max_doc_tokens, prefix_tokens=cfg.vocab_match_tokens,
                      prefix_pii_tokens=cfg.vocab_match_pii_tokens, prefix_depths=cfg.vocab_match_depths,
                      wire_tokens=cfg.wire_tokens, min_pii_spans=cfg.min_pii_spans, seed=cfg.seed, n_boot=cfg.n_boot)


def learned(name: str) -> bool:
    """Whether grid attacker ``name`` is trained (its result varies with the training seed)."""
    return get_attack_class(ALIASES.get(name, (name, {}))[0]).threat_model == "white-box (learned)"


def run_name(attack: str, boundary: str | Boundary, seed: int, first_seed: int) -> str:
    """The results run of one job: ``attacks/NAME/BOUNDARY``, with ``/seed-S`` for seeds after the first."""
    return f"attacks/{attack}/{boundary}" + ("" if seed == first_seed else f"/seed-{seed}")


def _load_partial(path: Path | None) -> dict[str, list[dict]]:
    """Rows already computed by an interrupted run: {job key: rows}."""
    done: dict[str, list[dict]] = {}
    if path is None or not path.is_file():
        return done
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut by the interruption
        if isinstance(rec, dict) and "key" in rec and "rows" in rec:
            done[rec["key"]] = rec["rows"]
    return done


def _study_row(job_rows: list[dict], seed: int) -> dict[str, Any]:
    """The pooled row of a job with its per-corpus top-1 (the study's tables) and its training seed."""
    row = dict(job_rows[0])
    row["per_corpus_top1"] = {r["corpus"]: r["metrics"]["token_acc_top1"]["value"] for r in job_rows[1:]}
    row["train_seed"] = seed
    return row


def run_study(cfg: StudyConfig, progress: bool = True, partial: str | Path | None = None,
              predictions_dir: str | Path | None = None) -> dict[str, Any]:
    """Run the study; returns ``{"config", "rows", "depth_id", "timing", ...}`` (see :func:`to_results`).

    ``partial``: a JSONL file where each finished (attack, boundary, seed) job is appended; a rerun skips the
    jobs found there whose key (:func:`benchmarks.attack_grid.job_key`) is unchanged and whose predictions file
    exists. ``predictions_dir``: each job's per-token predictions are written there as it finishes
    (:func:`attacks.predictions.predictions_path`); without it they are kept in ``study["predictions"]``.
    """
    import torch
    from tqdm.auto import tqdm

    from splitinfer.models import load_model

    from benchmarks.checkout import git_state

    t_start = time.perf_counter()
    git_hash, dirty = git_state(Path(__file__).resolve().parents[1])
    partial = Path(partial) if partial is not None else None
    done = _load_partial(partial)
    loaded = load_model(cfg.model, device=cfg.device)
    grid = grid_config(cfg)
    t0 = time.perf_counter()
    data = extract(loaded, grid)
    extract_s = time.perf_counter() - t0
    first = next(iter(data.train))
    log.info("taps ready in %.0f s: %d train, %d test tokens per boundary", extract_s, data.train[first].n_tokens,
             data.test[first].n_tokens)
    if not cfg.train_seeds:
        raise SplitInferError("the study needs at least one training seed, e.g. --train-seeds 0,1,2")
    rows: list[dict[str, Any]] = []
    preds: dict[str, Any] = {}  # run -> per-token predictions, when no predictions_dir is given
    resumed = 0
    jobs = [(s, job) for s in cfg.train_seeds for job in plan(grid, data.depth_of)
            if s == cfg.train_seeds[0] or learned(job.name)]
    fitted: dict[int, dict[tuple[Boundary, str], Any]] = {s: {} for s in cfg.train_seeds}  # per seed: proposers
    for seed, job in tqdm(jobs, desc="attacks", unit="fit", disable=not progress):
        seed_grid = replace(grid, seed=seed)
        run = run_name(job.name, job.boundary, seed, cfg.train_seeds[0])
        key = job_key(seed_grid, job, data, loaded.sha256)
        pred_file = None if predictions_dir is None else predictions_path(predictions_dir, run)
        if key in done and (pred_file is None or pred_file.is_file()):
            rows.append(_study_row(done[key], seed))
            resumed += 1
            continue
        job_preds: dict[str, Any] = {}
        job_rows = run_job(loaded, seed_grid, data, job, fitted[seed], job_preds)
        record = job_preds.popitem()[1]
        if predictions_dir is None:
            preds[run] = record
        else:
            write_all({run: record}, predictions_dir)
        rows.append(_study_row(job_rows, seed))
        if partial is not None:
            _append(partial, {"key": key, "job": job.name, "boundary": str(job.boundary), "seed": seed, "rows": job_rows})
    t = time.perf_counter()
    depth_id = depth_rows(loaded, grid, data)
    if depth_id:
        log.info("depth identification done in %.0f s", time.perf_counter() - t)
    return {"config": {**asdict(cfg), "model_sha256": loaded.sha256, "num_layers": loaded.num_layers,
                       "vocab_size": int(loaded.config.vocab_size),
                       "train_tokens_total": data.train[first].n_tokens,
                       "val_tokens_total": data.val[first].n_tokens if data.val else 0,
                       "test_tokens_total": data.test[first].n_tokens,
                       "test_documents": len(set(data.test[first].seq_doc.tolist())),
                       "pii_test": data.pii, "threads": torch.get_num_threads()},
            "rows": rows, "depth_id": depth_id, "predictions": preds, "git": {"hash": git_hash, "dirty": dirty},
            "timing": {"extract_seconds": round(extract_s, 1),
                       "total_seconds": round(time.perf_counter() - t_start, 1), "resumed_jobs": resumed}}


def _append(path: Path, rec: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")


def to_results(study: dict[str, Any]) -> dict[str, Any]:
    """A results document (:mod:`benchmarks.schema`) holding every metric, plus the raw rows."""
    from benchmarks.attack_wire import record_traffic
    from benchmarks.schema import add_metric, metric, new_results

    cfg = study["config"]
    results = new_results({"model": cfg["model"], "model_sha256": cfg["model_sha256"], "corpus": cfg["corpora"],
                           "split": "train/val/test by document", "seed": cfg["seed"], "study": cfg}, "attacks-depth")
    if "git" in study:  # the checkout when the study started, as a suite run records it (its own outputs aside)
        results["git_hash"], results["git_dirty"] = study["git"]["hash"], study["git"]["dirty"]
    first = cfg["train_seeds"][0]
    for r in study["rows"]:
        run = run_name(r["attack"], r["boundary"], r.get("train_seed", first), first)
        for name, m in r["metrics"].items():
            add_metric(results, run, name, metric(m["value"], m["ci_low"], m["ci_high"], m["n"], True, kind=m["kind"]))
        add_metric(results, run, "seconds_per_token", metric(r["seconds_per_token"], n=r["test_tokens"],
                                                              higher_is_better=False, kind="info", unit="s"))
        record_traffic(results, run, r["info"])
        if "seed_split_top1" in r["info"]:
            add_metric(results, run, "seed_split_top1", metric(r["info"]["seed_split_top1"],
                                                               n=r["info"].get("seed_test_pairs"), kind="info"))
    for (attack, boundary), v in seed_spread(study["rows"], first).items():
        for name, x in (("top1_seed_mean", v["mean"]), ("top1_seed_sd", v["sd"]), ("top1_seed_min", v["min"]),
                        ("top1_seed_max", v["max"])):
            add_metric(results, f"attacks/{attack}/{boundary}", name, metric(x, n=v["seeds"], kind="info"))
    for r in study["depth_id"]:
        run = f"attacks/{r['attack']}-{r['classifier']}/{r['boundary']}"
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
