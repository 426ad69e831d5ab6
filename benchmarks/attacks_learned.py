"""Ablation of the learned attackers at one head depth: what lifts token recovery?

Developer note: issue 14, finding 10.

Rows, all fitted and scored exactly as the per-depth study does it (its
:class:`~benchmarks.attacks_depth.StudyConfig` sizes, splits and options; one
attack grid per data size, :func:`benchmarks.attack_grid.run_job`; top-1 on
the user text of the pooled held-out, de-duplicated test documents of the four
corpora, chat-template tokens excluded, 95% bootstrap intervals over
documents, paired bootstrap differences against the probe):

1. the probe baseline (``linear-probe``, the study's options);
2. ``seq-decoder`` as in the study (skip path frozen after its probe warm start);
3. ``seq-decoder`` with ``freeze_skip=False`` and a longer schedule;
4. the full-vocabulary head (``output=tied``) of the probe, with coverage
   (the probe of row 1 is its pair);
5. more training data: ``linear-probe``, restricted and full-vocabulary, and
   the unfrozen ``seq-decoder`` at ``scales`` x the study's training tokens per
   corpus, the full-vocabulary probe and the seq-decoder each followed by
6. ``lm-beam`` (the public model as a language prior, beam search) over it at
   the largest scale, with the base attacker's top-5 accuracy (a lower bound
   of the ceiling of any re-ranking of its candidates).

Rows run in this order; ``results.json`` and ``report.md`` are rewritten after
every row, so an interrupted run keeps the rows it finished. Run (about 15
minutes on two CPU cores with scales 1,4)::

    OMP_NUM_THREADS=2 python -m benchmarks.attacks_learned --out reports/attacks_learned --scales 1,4

It writes ``results.json`` (:mod:`benchmarks.schema`) and ``report.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from attacks.boundary import Boundary
from benchmarks.attack_grid import Job, extract, run_job
from benchmarks.attacks_depth import StudyConfig, grid_config

log = logging.getLogger(__name__)

CEILING_K = 5  # the base's top-k reported beside lm-beam (a lower bound of its candidates' recall)
LONG = {"epochs": 16, "patience": 3, "freeze_skip": False}  # the unfrozen seq-decoder's longer schedule


@dataclass(frozen=True)
class Row:
    """One ablation row: a grid name, the options of every recipe it uses, and the data scale."""

    label: str
    name: str
    options: dict[str, dict[str, Any]]
    scale: int


@dataclass(frozen=True)
class AblationConfig:
    model: str = "default"
    depth: int = 8
    scales: tuple[int, ...] = (1, 4)  # x the study's training tokens per corpus
    long: dict[str, Any] = field(default_factory=lambda: dict(LONG))
    candidates: int = 8
    beam: int = 4
    lams: tuple[float, ...] = (0.25, 0.5, 1.0)
    seed: int = 0
    study: StudyConfig = StudyConfig()


def rows(cfg: AblationConfig) -> list[Row]:
    """The ablation's rows, cheapest first (see the module docstring)."""
    opts = cfg.study.hparams
    probe, seq, long = dict(opts["linear-probe"]), dict(opts["seq-decoder"]), {**opts["seq-decoder"], **cfg.long}
    top = max(cfg.scales)
    low = min(cfg.scales)
    out = [Row(f"probe baseline (linear-probe), {low}x data", "linear-probe", {"linear-probe": probe}, low),
           Row(f"seq-decoder as in the study (skip frozen), {low}x data", "seq-decoder", {"seq-decoder": seq}, low),
           Row(f"seq-decoder, freeze_skip=False, longer schedule, {low}x data", "seq-decoder",
               {"seq-decoder": long}, low),
           Row(f"full-vocabulary head (linear-probe, output=tied), {low}x data", "linear-probe",
               {"linear-probe": {**probe, "output": "tied"}}, low)]  # row 1 is its pair
    beam = {"candidates": cfg.candidates, "beam": cfg.beam, "lams": list(cfg.lams)}
    tied = {**probe, "output": "tied"}
    for s in sorted(set(cfg.scales) - {low}):
        out += [Row(f"linear-probe, {s}x data", "linear-probe", {"linear-probe": probe}, s),
                Row(f"full-vocabulary head (linear-probe, output=tied), {s}x data", "linear-probe",
                    {"linear-probe": tied}, s)]
    out.append(Row(f"+ LM-prior beam over the full-vocabulary linear-probe, {top}x data", "lm-beam",
                   {"lm-beam": {**beam, "base": "linear-probe"}, "linear-probe": tied}, top))
    for s in sorted(set(cfg.scales) - {low}):
        out.append(Row(f"seq-decoder, freeze_skip=False, longer schedule, {s}x data", "seq-decoder",
                       {"seq-decoder": long}, s))
    out.append(Row(f"+ LM-prior beam over seq-decoder (freeze_skip=False), {top}x data", "lm-beam",
                   {"lm-beam": {**beam, "base": "seq-decoder"}, "seq-decoder": long}, top))
    return out


def _key(scale: int, name: str, options: dict[str, Any]) -> str:
    return json.dumps([scale, name, options], sort_keys=True, default=str)


def run_ablation(cfg: AblationConfig, only: list[int] | None = None,
                 on_row: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Fit and score every row (or the rows numbered ``only``, 1-based) in order; returns config, rows and timing.

    ``on_row`` gets the partial result (same shape) after every row.
    """
    from attacks.evaluate import collect, prior_from_taps
    from splitinfer.models import load_model

    t_start = time.perf_counter()
    loaded = load_model(cfg.model, device=cfg.study.device)
    boundary = Boundary("head", cfg.depth)
    todo = [r for i, r in enumerate(rows(cfg), 1) if only is None or i in only]
    fitted_by: dict[str, Any] = {}  # (scale, recipe, options) -> fitted attacker, shared by lm-beam rows
    out, sizes, extract_s, datas = [], {}, {}, {}

    def result() -> dict[str, Any]:
        return {"config": {**asdict(cfg), "model_sha256": loaded.sha256, "boundary": str(boundary), "sizes": sizes},
                "rows": out, "timing": {"extract_seconds": extract_s,
                                        "total_seconds": round(time.perf_counter() - t_start, 1)}}

    for row in todo:
        scale = row.scale
        study = replace(cfg.study, head_depths=(cfg.depth,), tail_layers=(), seed=cfg.seed,
                        train_tokens=cfg.study.train_tokens * scale)
        if scale not in datas:
            t = time.perf_counter()
            datas[scale] = data = extract(loaded, grid_config(study))
            extract_s[scale] = round(time.perf_counter() - t, 1)
            sizes[scale] = {"train_tokens": data.train[boundary].n_tokens, "val_tokens": data.val[boundary].n_tokens,
                            "test_tokens": data.test[boundary].n_tokens,
                            "test_documents": len(set(data.test[boundary].seq_doc.tolist()))}
        data = datas[scale]
        grid = replace(grid_config(study), attacks=(row.name,), options=row.options)
        fitted = {(boundary, n): fitted_by[_key(scale, n, o)] for n, o in row.options.items()
                  if n != row.name and _key(scale, n, o) in fitted_by}
        t = time.perf_counter()
        job_rows = run_job(loaded, grid, data, Job(row.name, row.name, {}, boundary, cfg.depth), fitted)
        rec = {"label": row.label, "name": row.name, "options": row.options, "scale": row.scale,
               **{k: job_rows[0][k] for k in ("threat_model", "metrics", "fit_seconds", "invert_seconds",
                                               "train_tokens", "test_tokens", "info", "doc_top1")},
               "per_corpus_top1": {r["corpus"]: r["metrics"]["token_acc_top1"]["value"] for r in job_rows[1:]},
               "seconds": round(time.perf_counter() - t, 1)}
        atk = fitted[(boundary, row.name)]
        fitted_by[_key(scale, row.name, row.options[row.name])] = atk
        if row.name == "lm-beam":  # the ceiling of re-ranking: the base's top-k accuracy on user text
            test = data.test[boundary]
            inv = atk.base.invert(test, k=CEILING_K)  # predictions keep at most 5 guesses per token
            summary = collect(inv, test,
                              vocab_size=int(loaded.config.vocab_size), prior=prior_from_taps(data.train[boundary]),
                              ks=(1, CEILING_K), n_boot=cfg.study.n_boot, seed=cfg.seed).summarize()
            rec["base_candidates_topk"] = summary[f"token_acc_top{CEILING_K}"]
            rec["base_top1"] = summary["token_acc_top1"]
        out.append(rec)
        log.info("%s: top-1 %.3f (%.0f s)", row.label, rec["metrics"]["token_acc_top1"]["value"], rec["seconds"])
        if on_row is not None:
            on_row(result())
    return result()


def to_results(ab: dict[str, Any]) -> dict[str, Any]:
    """A results document (:mod:`benchmarks.schema`): every row's metrics under ``learned/<n>-<name>/<boundary>``."""
    from benchmarks.schema import add_metric, metric, new_results

    cfg = ab["config"]
    results = new_results({"model": cfg["model"], "model_sha256": cfg["model_sha256"], "corpus": list(
        cfg["study"]["corpora"]), "split": "train/val/test by document", "seed": cfg["seed"], "ablation": cfg},
        "attacks-learned")
    for i, r in enumerate(ab["rows"], 1):
        run = f"learned/{i}-{r['name']}-{r['scale']}x/{cfg['boundary']}"
        for name, m in r["metrics"].items():
            add_metric(results, run, name, metric(m["value"], m["ci_low"], m["ci_high"], m["n"], True, kind=m["kind"]))
        if "base_candidates_topk" in r:
            m = r["base_candidates_topk"]
            add_metric(results, run, f"base_token_acc_top{CEILING_K}",
                       metric(m["value"], m["ci_low"], m["ci_high"], m["n"], True, kind="info"))
    results["rows"] = ab["rows"]
    results["timing"] = ab["timing"]
    return results


def write_outputs(ab: dict[str, Any], out: str | Path, command: str,
                  git: tuple[str | None, bool | None] | None = None) -> tuple[Path, Path]:
    """``results.json`` and ``report.md`` under ``out``; ``git``: (hash, dirty) taken when the run started (the
    files written after each row would otherwise make the tree look dirty)."""
    from benchmarks.attacks_learned_report import markdown
    from benchmarks.schema import save
    from splitinfer.atomic import atomic_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = to_results(ab)
    if git is not None:
        results["git_hash"], results["git_dirty"] = git
    path_json = save(results, out / "results.json")
    path_md = out / "report.md"
    with atomic_file(path_md) as tmp:
        Path(tmp).write_text(markdown(ab, command, results["git_hash"], results["git_dirty"]), encoding="utf-8")
    return path_json, path_md


def main(argv: list[str] | None = None) -> int:
    from attacks.errors import AttackError
    from benchmarks.checkout import git_state
    from splitinfer.cli_flags import int_list
    from splitinfer.errors import SplitInferError

    p = argparse.ArgumentParser(prog="python -m benchmarks.attacks_learned", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for results.json and report.md")
    p.add_argument("--model", default="default")
    p.add_argument("--depth", type=int, default=8, help="head depth (default %(default)s)")
    p.add_argument("--scales", type=int_list, default=(1, 4), help="data scales, x the study's training tokens "
                   "per corpus (default 1,4)")
    p.add_argument("--rows", type=int_list, default=None, help="only these rows (1-based; default: all)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    command = "python -m benchmarks.attacks_learned " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        if any(s < 1 for s in args.scales) or args.depth < 1:
            raise SplitInferError(f"--scales {args.scales} / --depth {args.depth}: give integers >= 1")
        cfg = AblationConfig(model=args.model, depth=args.depth, scales=tuple(args.scales), seed=args.seed)
        git = git_state()
        ab = run_ablation(cfg, list(args.rows) if args.rows else None,
                          on_row=lambda partial: write_outputs(partial, args.out, command, git))
        paths = write_outputs(ab, args.out, command, git)
    except (SplitInferError, AttackError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {paths[0]} and {paths[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
