"""How much more of a text the cloud recovers when the same text reaches it in r sessions.

A deployment resends text whenever a new session starts from old context: a fixed system prompt sent at the
start of every conversation, the history a multi-turn chat resends when it reconnects or a stateless server
needs it again, a document asked about twice, an agent's tool descriptions. Each session of a noise defense
draws fresh noise (its draws are keyed by session, :mod:`splitinfer.defenses.keyed`), so an observer who links
the r sessions averages the released states and sees the noise shrink by sqrt(r) (arXiv 2605.24042 and
BiSR, arXiv 2409.00960, both name repeated queries as the averaging threat).

For each head depth and wire-noise spec this scores ``session-average`` (the Mahalanobis matcher on the mean of
r sessions, :mod:`attacks.recipes.session_average`) at each r on the common scored set of the suite named by
``--suite`` (its corpora, sample sizes and scored set), r = 1 being the single-session Mahalanobis matcher.
At each r a fresh attacker is fitted on the mean of r of its own simulated releases of its training text
(:meth:`~attacks.recipes.session_average.SessionAverage.fit_sessions`), so its candidate proposer ranks for
the noise it then inverts. The r sessions are nested (sessions 0..r-1 of the same clean states) so each r's
gain over r = 1 is a paired bootstrap over documents. Specs may set ``per_session=false`` (the same token path
gets the same draw in every session): averaging then gains nothing by construction, which the sweep measures
rather than assumes.

    flock /tmp/heavy.lock env OMP_NUM_THREADS=2 PYTHONPATH=. python -m benchmarks.resend_sweep \\
        --suite literature --depths 2 --repeats 1,2,4,8,16 --out reports/resend \\
        --specs 'noise(sigma=0.01)' 'noise(sigma=0.02)' 'noise(sigma=0.05)'

``--device cuda`` runs the model and the attackers on a GPU (a head-8 sweep of one spec took about five minutes
on an H200). A cell fitted per r takes about half an hour on two CPU cores, and a sweep writes nothing until it
ends, so long sweeps are best run one spec per sweep (each its own ``--out``) and joined with
``--merge DIR... --out OUT`` (:mod:`benchmarks.resend_merge`).
"""

from __future__ import annotations

import argparse
import math
import re
import time
from pathlib import Path

from tqdm import tqdm

from attacks.boundary import Boundary
from attacks.defended import attacker_view, defend_taps, resent_taps
from attacks.evaluate import paired_gap, prior_from_taps
from attacks.predictions import write_all
from attacks.registry import make_attack
from benchmarks.bench_output import document, write_dir
from benchmarks.defenses_calibrate import calibrate
from benchmarks.grid_cell import score_on_set
from benchmarks.merge import copy_predictions
from benchmarks.resend_merge import load_parts, load_sweep, merge_data, provenance
from benchmarks.schema import add_metric, metric
from benchmarks.scored_set import ScoredSetConfig, set_size, take
from benchmarks.stage_defenses import grid_data, spec_pipeline
from splitinfer.defenses import DefensePipeline, check_specs
from splitinfer.defenses.base import DefenseError, format_items
from splitinfer.errors import SplitInferError
from splitinfer.server_config import check_device

ATTACK = "session-average"
THREAT = "white-box (exact), adaptive, text resent in r sessions"


def _sigma(pipe: DefensePipeline) -> tuple[float, bool]:
    """(sigma in units of the clip, per_session) of the spec's wire noise."""
    for d in pipe.items:
        if hasattr(d, "sigma") and hasattr(d, "per_session"):
            return float(d.sigma), bool(d.per_session)
    raise DefenseError(f"{pipe.label}: no wire noise to resend under; give noise, pclip or shaped-noise specs")


def run(loaded, cfg: dict, specs: list[str], depths: list[int], repeats: list[int], seed: int = 0,
        progress: bool = True) -> tuple[list[dict], dict]:
    """One row per (depth, spec, r): session-average's top-1 on the cell's scored set; per-token predictions."""
    sset = ScoredSetConfig.from_suite(cfg)
    _, data = grid_data(loaded, cfg, depths, seed, sset)
    opts = dict(cfg.get("options", {}).get(ATTACK, {}))
    opts.pop("repeats", None)
    rows, preds = [], {}
    jobs = [(a, s) for a in depths for s in specs]
    for a, spec in tqdm(jobs, desc="resend", unit="cell", disable=not progress):
        head = Boundary("head", a)
        train = data.train[head]
        pipe = calibrate(loaded, spec_pipeline(spec, train), a, int(cfg.get("tail_layers", 2)), train, seed,
                         corpora=list(cfg.get("corpora", ["prose"])), max_length=int(cfg.get("max_length", 128)))
        sigma, fresh = _sigma(pipe)
        clean = take(data.test[head], data.chosen[head])
        target = defend_taps(clean, pipe)  # session 0: the r = 1 release
        first, view = None, attacker_view(pipe)
        prior, vocab = prior_from_taps(train), int(loaded.config.vocab_size)  # the baselines: one per cell
        for r in repeats:
            t0 = time.perf_counter()  # a fresh attacker per r, fitted on its own r-session means of its text
            atk = make_attack(ATTACK, model=loaded, seed=seed, defense=format_items(pipe.items, public=True), **opts)
            atk.fit_sessions(resent_taps(train, view, r))
            t1 = time.perf_counter()
            fit_s = t1 - t0
            inv = atk.invert_sessions(resent_taps(clean, pipe, r), k=5)
            inv_s = time.perf_counter() - t1
            run_name = f"resend/{head}/{pipe.label}/r={r}"
            got, preds[run_name] = score_on_set(inv, target, vocab=vocab, prior=prior,
                                                n_boot=int(cfg.get("n_boot", 1000)),
                                                seed=seed, meta={"attack": ATTACK, "defense": pipe.label, "r": r})
            row = {"run": run_name, "metrics": got["metrics"], "depth": a, "defense": pipe.label, "sigma": sigma,
                   "per_session": fresh, "r": r,
                   "effective_sigma": sigma / math.sqrt(r) if fresh else sigma, "threat_model": THREAT,
                   "top1": got["metrics"]["token_acc_top1"], "doc_top1": got["doc_top1"],
                   "scored_set": dict(zip(("tokens", "documents"), set_size(target))),
                   "fit_seconds": fit_s, "fitted_on_sessions": r,
                   "seconds_per_token": inv_s / max(1, target.n_tokens)}
            first = first or row
            row["gain_over_r1"] = None if row is first else paired_gap(row, first, seed=seed)
            rows.append(row)
    return rows, preds


def _pct(m: dict) -> str:
    return f"{100 * m['value']:.1f} [{100 * m['ci_low']:.1f}, {100 * m['ci_high']:.1f}]"


def report(data: dict) -> str:
    rows = data["rows"]
    n = rows[0]["scored_set"] if rows else {"tokens": 0, "documents": 0}
    lines = ["# Resent text: recovery against the number of sessions that carried it", "",
             "What it answers: if the same text reaches the cloud in r sessions, each with fresh noise, how much "
             "more of it does an observer who links the sessions recover, and does keying the noise to the text "
             "instead of the session stop that?", "",
             f"Model `{data['model']}`; the `{data['suite']}` suite's corpora and common scored set ({n['tokens']} "
             f"user-text tokens from {n['documents']} held-out documents per cell; intervals over documents); "
             f"commit {data['git']}, device {data.get('device', 'cpu')}. "
             f"Attacker `{ATTACK}` ({THREAT}): the Mahalanobis matcher on the mean of the r "
             "linked sessions' states, likelihood r times the single session's; r = 1 is one session. Gain: "
             "top-1 at r minus top-1 at r = 1, paired bootstrap over documents (* when its interval excludes 0). "
             "sigma is in units of the clip; effective sigma = sigma / sqrt(r) for fresh draws per session.", "",
             "| head depth | defense | draws | r | effective sigma (x C) | top-1 % [95% CI] | gain over r = 1 "
             "(points) | s/token |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g = r["gain_over_r1"]
        gain = "-" if g is None else (f"{100 * g['value']:+.1f} [{100 * g['ci_low']:+.1f}, {100 * g['ci_high']:+.1f}]"
                                      + ("*" if g["ci_low"] > 0 or g["ci_high"] < 0 else ""))
        lines.append(f"| {r['depth']} | `{r['defense']}` | {'per session' if r['per_session'] else 'per text'} | "
                     f"{r['r']} | {r['effective_sigma']:.4g} | {_pct(r['top1'])} | {gain} | "
                     f"{r['seconds_per_token']:.3f} |")
    lines += ["", "![recovery against sessions](recovery_vs_sessions.png)", "",
              f"Wall time {data['wall_s']:.0f} s{_parts(data)}. "
              "Per-token predictions of every row in `predictions/`.", ""]
    return "\n".join(lines)


def _parts(data: dict) -> str:
    """How a joined sweep's wall time was spent (``--merge``): the parts it sums."""
    parts = data.get("merged_from")
    if not parts:
        return ""
    return (f" (the sum of {len(parts)} sweeps joined with --merge: "
            + ", ".join(f"{Path(m['dir']).name} {m['wall_s']:.0f} s" for m in parts) + ")")


def plot(rows: list[dict], path: Path) -> Path | None:
    """Recovery against r (log scale), one line per (depth, defense), with 95% intervals."""
    from benchmarks.plots import plt, save_figure

    if not rows:
        return None
    keys = list(dict.fromkeys((r["depth"], r["defense"]) for r in rows))  # one line each, in row order
    fig, ax = plt.subplots(figsize=(7, 4.5 + 0.2 * len(keys)))
    for key in keys:
        at = [r for r in rows if (r["depth"], r["defense"]) == key]
        x = [r["r"] for r in at]
        y = [100 * r["top1"]["value"] for r in at]
        err = [[yy - 100 * r["top1"]["ci_low"] for yy, r in zip(y, at)],
               [100 * r["top1"]["ci_high"] - yy for yy, r in zip(y, at)]]
        label = f"head {key[0]} {re.sub(r',profile=[0-9a-f]+', '', key[1])}"  # the profile hash says nothing here
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sessions carrying the same text (r)")
    ax.set_ylabel("top-1 recovery of user text (%)")
    ax.set_title(f"Resent text under noise ({ATTACK}, {THREAT})", fontsize=9)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13))  # below the axes: no line hidden
    return save_figure(fig, path)


def replot(out: Path) -> Path | None:
    """Redraw ``out``'s plot from the rows its results.json stores (no model run); a one-line error if absent."""
    return plot(load_sweep(out, "--replot")["data"]["rows"], out / "recovery_vs_sessions.png")


def to_document(data: dict) -> dict:
    config = {k: v for k, v in data.items() if isinstance(v, (str, int, float, bool)) or v is None}
    doc = document("resend-sweep", {**config, "specs": data["specs"], "repeats": data["repeats"]}, data)
    for r in data["rows"]:  # under the predictions' run names, every metric: `attack rescore` checks them all
        for name, m in r["metrics"].items():
            add_metric(doc, r["run"], name, metric(m["value"], m["ci_low"], m["ci_high"], m["n"],
                                                   m["higher_is_better"], kind=m["kind"]))
    return doc


def merge(dirs: list[str], out: str | Path) -> int:
    """Join sweeps of one run, one spec each (:mod:`benchmarks.resend_merge`), into ``out``: report.md,
    results.json, the plot and predictions/, as one sweep of all their specs writes them."""
    parts = load_parts(dirs)
    data = merge_data(parts)
    doc = {**to_document(data), **provenance(parts)}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    copy_predictions([path for path, _ in parts], out)
    plot(data["rows"], out / "recovery_vs_sessions.png")
    return write_dir(out, report(data), doc)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    from benchmarks.checkout import git_state, remember_git_state
    from benchmarks.suite_names import checked_suite
    from splitinfer.models import load_model

    remember_git_state()  # the checkout as this command found it, before it writes anything
    p = argparse.ArgumentParser(prog="python -m benchmarks.resend_sweep", description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="literature",
                   help="whose [defenses] corpora, sizes and scored set (default literature)")
    p.add_argument("--specs", nargs="+", help="wire-noise specs (noise, pclip, shaped-noise); required to run")
    p.add_argument("--depths", default="2", help="head depths, comma-separated (default 2)")
    p.add_argument("--repeats", default="1,2,4,8,16", help="sessions r, comma-separated (default 1,2,4,8,16)")
    p.add_argument("--out", help="directory for report.md, results.json, the plot and predictions/; required to run")
    p.add_argument("--device", help="run the model and attackers here (cpu, cuda, cuda:N; default the suite's)")
    p.add_argument("--replot", metavar="DIR", help="only redraw DIR's plot from its results.json, then stop")
    p.add_argument("--merge", nargs="+", metavar="DIR",
                   help="join sweeps of the same run, one spec each, into --out (benchmarks/resend_merge.py), "
                        "then stop")
    args = p.parse_args(argv)
    if args.merge:
        if not args.out:
            p.error("--merge needs --out, the directory the joined sweep is written to")
        try:
            return merge(args.merge, args.out)
        except SplitInferError as e:
            p.error(str(e))
    if args.replot:
        try:
            print(replot(Path(args.replot)))
        except SplitInferError as e:
            p.error(str(e))
        return 0
    if not args.specs or not args.out:
        p.error("give --specs and --out (or --replot DIR to redraw a finished sweep's plot)")
    try:
        depths, repeats = _ints(args.depths), _ints(args.repeats)
    except ValueError:
        p.error("--depths and --repeats take integers, comma-separated, e.g. --repeats 1,2,4,8,16")
    if not depths or not repeats or min(repeats) < 1 or repeats[0] != 1:
        p.error("give at least one depth, and repeats that start at 1 (the single session every gain is against)")
    try:
        suite = checked_suite(args.suite)
        cfg = suite.stage("defenses") or {}
        device = args.device or suite.device
        check_device(device)
        for s in args.specs:
            _sigma(DefensePipeline.parse(s))
        loaded = load_model(suite.model, dtype=suite.dtype, device=device, seed=suite.seed)
        check_specs(args.specs, int(loaded.hidden_size), "--specs")
    except SplitInferError as e:
        p.error(str(e))
    if max(depths) + 2 > loaded.num_layers or min(depths) < 1:
        p.error(f"head depths must lie in 1..{loaded.num_layers - 2} for this {loaded.num_layers}-layer model")
    git, dirty = git_state()
    t0 = time.perf_counter()
    rows, preds = run(loaded, cfg, args.specs, depths, repeats, seed=suite.seed)
    data = {"model": loaded.spec, "model_sha256": loaded.sha256, "suite": args.suite, "specs": args.specs,
            "repeats": repeats, "device": device, "git": f"{git}{' (dirty)' if dirty else ''}",
            "wall_s": time.perf_counter() - t0,
            "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot(rows, out / "recovery_vs_sessions.png")
    write_all(preds, out)  # under out/predictions/
    return write_dir(out, report(data), to_document(data))


if __name__ == "__main__":
    raise SystemExit(main())
