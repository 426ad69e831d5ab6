"""Harness stage ``defenses``: head depth x defense x strength x adaptive attacker, with utility and cost.

For every head depth and defense spec of the suite it measures, side by side
(DESIGN.md section 8):

- recovery: each attacker on the victim's defended held-out states (teacher-
  forced taps of the test split through :func:`attacks.defended.victim_model`
  and :func:`attacks.defended.defend_taps`); attackers are adaptive: they know
  the mechanism and its public parameters, train on their own defended pairs
  (:func:`attacks.defended.attacker_view`, other noise draws) made with the
  *public* weights. Every attacker of a (depth, defense) cell is scored on
  exactly the cell's scored set (:mod:`benchmarks.scored_set`: held-out,
  de-duplicated user text of every corpus, chat user turns included, public
  positions unscored; the suite's ``scored_set`` table sets its size and
  floor) through :func:`benchmarks.grid_cell.score_on_set`, the attack grid's
  scoring; the cell's recovery is the maximum top-1 over its attackers, each
  other attacker's gap to it and the defended-minus-undefended difference are
  paired bootstraps over documents (issue 28 findings 1 and 3). Per-token
  predictions of every attacker go beside the results (``predictions/``), so
  ``splitinfer attack rescore`` checks every defense row (finding 8).
- utility (:mod:`benchmarks.defense_utility`, finding 5): next-token
  agreement (argmax) and perplexity of the defended split against the
  undefended model on ``utility_positions`` teacher-forced positions of
  held-out chat-form text (the model's template and special tokens), through
  the real runtime (:meth:`SplitModel.forward_step`, the defense on the wire);
  greedy identity, answer token F1 and answer perplexity under the undefended
  model on ``greedy_prompts`` held-out prompts; 95% intervals over sequences
  and prompts.
- cost: bytes per decode step (measured frames, sequential, over the greedy
  prompts), tau of ``combined`` under the defense, and tok/s of that run
  modelled at 80 ms RTT and 100 Mbit/s (:func:`splitinfer.timing.fit` then
  ``project``) on the suite's cost prompts (``categories``).

``random-split`` specs are rows of their own (:mod:`benchmarks.defenses_random_split`: depth identification
from the states alone, then end-to-end recovery). Test splits of long documents are cut to >= 10 documents per
corpus: the taps and scored sets are the attack grid's own (:func:`grid_data`).

A noise spec without ``clip=`` gets the median per-token L2 norm of the public
model's training states at that depth (positions >= 1), recorded in its label.
``overhead`` times the wire defenses alone per step at the model's width.

Attackers a defense brings (its ``attackers``, e.g. a plugin's) join the suite's attackers on every row. A
component that fails (wrong shapes or non-finite states, or any error of a plugin's component) is left out and
listed in ``failed_components``: a failed attacker drops from its rows, a failed defense loses its row; the rest
of the grid runs.

Under ``bench run --shard I/N`` (:mod:`benchmarks.shard`) the stage runs the (depth, spec) configurations
numbered ``j % N == I`` in the grid's order (rows carry ``job = j``) and extracts taps at their depths only;
``random-split`` rows and the overhead timings run in shard 0.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import asdict

import numpy as np
from tqdm import tqdm

from attacks.plugins import droppable
from attacks.defended import (applies, as_public, attacker_view, defend_taps, resent_taps, show_cloud, show_traffic,
                              victim_model)
from attacks.evaluate import prior_from_taps
from attacks.registry import get_attack_class, make_attack
from attacks.tapdata import Taps
from attacks.boundary import Boundary
from benchmarks.attack_grid import GridConfig, GridData, Victim, extract, extract_split, row_threat_model, test_pool
from benchmarks.attack_tables import SCOPE, baseline_line, cell
from benchmarks.defenses_adv import disclosed_attackers
from benchmarks.defenses_calibrate import calibrate
from benchmarks.defenses_tables import attackers_table, recovery_table, utility_table
from benchmarks.defense_utility import (cell_utility, chat_form_sequences, defended_utility,  # noqa: F401
                                        held_out_prompts, utility_sequences)  # the two utility_*: clip_ablation's
from benchmarks.defenses_private import paired_label, public_label, with_trained_adapter
from benchmarks.defenses_overhead import overhead_ms
from benchmarks.defenses_random_split import random_split_row
from benchmarks.grid_cell import gaps_to_strongest, score_on_set, strongest, summarise_row, with_undefended_gaps
from benchmarks.schema import add_metric, metric, record_failure
from benchmarks.scored_set import ScoredSetConfig, set_size, take
from benchmarks.shard import Shard
from splitinfer.defenses import DefensePipeline, check_specs
from splitinfer.defenses.base import format_items
from splitinfer.errors import ComponentError

log = logging.getLogger(__name__)

FAMILY_ORDER = ("none", "noise", "quant", "lora-random", "lora-private", "permute", "random-split")


def split_taps(loaded, cfg: dict, depths: list[int], split: str, per_corpus: int) -> tuple[dict[int, Taps], dict]:
    """{depth: the public model's head taps of ``split``, the suite's corpora concatenated}, {depth: corpus rows}."""
    parts: dict[int, list[Taps]] = {a: [] for a in depths}
    rows: dict[int, dict[str, tuple[int, int]]] = {a: {} for a in depths}
    heads = {a: Boundary("head", a) for a in depths}
    for corpus in cfg.get("corpora", ["prose"]):
        got = extract_split(loaded, corpus, list(heads.values()), split, per_corpus, cfg.get("max_length", 128))
        for a, b in heads.items():
            start = sum(t.n_tokens for t in parts[a])
            rows[a][corpus] = (start, start + got[b].n_tokens)
            parts[a].append(got[b])
    return {a: Taps.concat(v) for a, v in parts.items()}, rows


def grid_data(loaded, cfg: dict, depths: list[int], seed: int, sset: ScoredSetConfig) -> tuple[GridConfig, GridData]:
    """The attack grid's extraction (:func:`benchmarks.attack_grid.extract`) for this table: train and test taps
    per head depth and each depth's common scored set, as the attacks stage makes them for the same corpora,
    sizes and ``scored_set`` (one grid: the same sets and the same scoring code, issue 28)."""
    n_corp = len(cfg.get("corpora", ["prose"]))
    grid = GridConfig(head_depths=tuple(depths), corpora=tuple(cfg.get("corpora", ["prose"])), attacks=(),
                      train_tokens=int(cfg.get("train_tokens", 4000)) // n_corp,
                      test_tokens=int(cfg.get("test_tokens", 800)) // n_corp, max_length=int(cfg.get("max_length", 128)),
                      max_doc_tokens=cfg.get("max_doc_tokens"), seed=seed, scored_set=sset)
    return grid, extract(loaded, grid)


def median_clip(train: Taps) -> float:
    """noise's default clip C: the median per-token L2 norm of the states at positions >= 1, to 2 decimals."""
    pos = train.positions()
    return round(float(np.median(np.linalg.norm(np.asarray(train.hidden[pos >= 1], dtype=np.float32), axis=1))), 2)


def spec_pipeline(spec: str, train: Taps) -> DefensePipeline:
    """The spec, with noise's clip set to the median state norm when the spec leaves it out."""
    pipe = DefensePipeline.parse(spec)
    if pipe.get("noise") is not None and "clip=" not in spec:
        pipe = DefensePipeline.parse(spec, {"noise.clip": median_clip(train)})
    return pipe


def _deployment_pairs(loaded, cfg: dict, pipe: DefensePipeline, depth: int, ks: list[int]) -> dict[int, Taps]:
    """{k: the first k (state, token) pairs of the deployment}: the victim's defended states of training-split
    documents (never the test documents), presented as the public model's taps."""
    n_corp = len(cfg.get("corpora", ["prose"]))
    got, _ = split_taps(victim_model(loaded, pipe, depth), cfg, [depth], "train", -(-max(ks) // n_corp))
    known = defend_taps(as_public(got[depth], loaded), pipe, session0=1 << 20)  # other sessions than the test's
    return {k: known.select_tokens(range(min(k, known.n_tokens))) if k else known for k in ks}  # k = 0: unused


def _threat(name: str, pipe: DefensePipeline) -> str:
    """The row's label (DESIGN.md section 4): the recipe's, shadow against private local layers, + adaptive."""
    victim = Victim(defense=pipe.label, private_local_layers=bool(pipe.model_items))
    base = row_threat_model(get_attack_class(name).threat_model, victim)
    return base if pipe.is_none else f"{base}, adaptive"


def _attack(loaded, name: str, opts: dict, pipe: DefensePipeline, train: Taps, target: Taps, seed: int,
            run: str, preds: dict, pairs: dict[int, Taps] | None = None, n_boot: int = 1000,
            clean: Taps | None = None, traffic: Taps | None = None) -> list[dict]:
    """The attacker fitted on its own defended public-model pairs and scored on the victim's defended states of
    the cell's scored set (``target``, every attacker the same); with ``pairs`` ({k: k deployment pairs}) a
    token classifier is also fine-tuned on each k (``paired``, DESIGN.md 4). An attacker of resent text
    (``session-average``) sees ``repeats`` fresh sessions of the same states before the defense (``clean``); one
    that learns from the deployment's traffic (``vocab-match-aligned``) sees the victim's released states of the
    whole test pool (``traffic``, before the defense), never their tokens.
    Per-token predictions go to ``preds[f"{run}/{name}"]`` (``/k=K`` for paired)."""
    own = attacker_view(pipe)
    hp = dict(opts)
    if getattr(get_attack_class(name), "adaptive", False):  # it is told the defense's public part
        hp["defense"] = format_items(pipe.items, public=True)
    atk = make_attack(name, model=loaded, seed=seed, **hp)
    t0 = time.perf_counter()
    resent = hasattr(atk, "invert_sessions") and clean is not None  # the same text resent in fresh sessions
    repeats = int(atk.hparams["repeats"]) if resent else 1
    if resent:  # fitted on its own r-session means: proposer and covariance match what it inverts
        atk.fit_sessions(resent_taps(train, own, repeats))
    else:
        atk.fit(defend_taps(train, own))
    show_cloud(atk, loaded, pipe, int(target.meta["depth"]))  # permute: the cloud's own transformed weights
    if traffic is not None:
        show_traffic(atk, lambda: defend_taps(traffic, pipe))
    vocab, prior = int(loaded.config.vocab_size), prior_from_taps(train)
    t1 = time.perf_counter()
    if resent:
        inv = atk.invert_sessions(resent_taps(clean, pipe, repeats), k=5)
    else:
        inv = atk.invert(target, k=5)
    inv_s = time.perf_counter() - t1
    got, preds[f"{run}/{name}"] = score_on_set(inv, target, vocab=vocab, prior=prior, n_boot=n_boot, seed=seed,
                                               meta={"attack": name, "defense": pipe.label})
    fitted = {k: v for k, v in inv.info.items() if k.startswith("adapter_") and isinstance(v, (bool, int, float))}
    if "alignment_converged" in atk.fit_report:  # vocab-match-aligned: whether it matched with an exact basis
        fitted["alignment_converged"] = bool(atk.fit_report["alignment_converged"])
    if hasattr(atk, "scan_cap"):  # a matcher's scan as it ran in this cell (None: the whole vocabulary)
        fitted["candidate_cap"] = atk.scan_cap(vocab)
    out = [{"attack": name, "threat_model": _threat(name, pipe), **got, "seconds": time.perf_counter() - t0,
            "seconds_per_token": inv_s / max(1, target.n_tokens), **fitted,  # vocab-match-fitted
            **({"fitted_on_sessions": repeats} if resent else {})}]
    if pairs and hasattr(atk, "fine_tune"):
        public = {k: v.clone() for k, v in atk.module.state_dict().items()}
        for k, known in sorted(pairs.items()):
            t1 = time.perf_counter()
            atk.module.load_state_dict(public)
            used = atk.fine_tune(known) if k else 0
            paired = atk.invert(target, k=5) if k else inv
            got, preds[f"{run}/{name}+paired/k={k}"] = score_on_set(
                paired, target, vocab=vocab, prior=prior, n_boot=n_boot, seed=seed,
                meta={"attack": f"{name}+paired", "k": k, "defense": pipe.label})
            kept = bool(k) and bool(atk.fit_report.get("paired_kept_public"))  # validation kept the public fit
            out.append({"attack": f"{name}+paired", "k": k, "pairs_used": used, "kept_public": kept, **got,
                        "threat_model": paired_label(out[0]["threat_model"], k) if k else out[0]["threat_model"],
                        "seconds": time.perf_counter() - t1})
    return out


def _add(results: dict, run: str, name: str, m: dict, higher: bool, kind: str = "accuracy") -> None:
    add_metric(results, run, name, metric(m["value"], m.get("ci_low"), m.get("ci_high"), m.get("n"), higher,
                                          kind=kind))


def _record(results: dict, run: str, row: dict) -> None:
    _add(results, run, "recovery_top1", row["best"]["metrics"]["token_acc_top1"], False)
    iv = row["intervals"]
    for key, better, kind in (("next_token_agreement", True, "accuracy"), ("greedy_identity", True, "accuracy"),
                              ("answer_token_f1", True, "accuracy"), ("perplexity", False, "info"),
                              ("answer_perplexity", False, "info")):
        _add(results, run, key, iv[key], better, kind)
    for key, better in (("bytes_per_step", False), ("tau_combined", True), ("modelled_tok_s_80ms", True)):
        add_metric(results, run, key, metric(row[key], higher_is_better=better, kind="info"))
    for a in row["attackers"]:  # every metric of every attacker: `attack rescore` checks them against predictions
        sub = f"{run}/{a['attack']}" + (f"/k={a['k']}" if "k" in a else "")
        for name, m in a["metrics"].items():
            add_metric(results, sub, name, metric(m["value"], m["ci_low"], m["ci_high"], m["n"],
                                                  m["higher_is_better"], kind=m["kind"]))


def rows_elsewhere(cfg: dict) -> dict | None:
    """The cells (head depth, spec) of the suite named by ``rows_elsewhere`` that this table leaves out: a quick
    suite keeps fewer rows at the same sample sizes and says which live only in ``full`` (issue 28)."""
    from benchmarks.suite import load_suite

    if not cfg.get("rows_elsewhere"):
        return None
    other = load_suite(cfg["rows_elsewhere"]).stage("defenses") or {}
    here, depths = set(cfg.get("defenses", ["none"])), set(cfg.get("head_depths", [2]))
    cells = [s if s.startswith("random-split") else f"head {a} `{s}`" for s in other.get("defenses", [])
             for a in ([0] if s.startswith("random-split") else other.get("head_depths", [2]))
             if s not in here or (a not in depths and not s.startswith("random-split"))]
    return {"suite": cfg["rows_elsewhere"], "cells": cells}


def _droppable_defense(spec: str, error: BaseException) -> str | None:
    """:func:`attacks.plugins.droppable` for the defenses a spec composes: wrong output of any, or any error when
    one of them is a plugin's."""
    if isinstance(error, ComponentError):
        return str(error)
    for d in DefensePipeline.parse(spec).items:
        why = droppable("defense", d.name, error)
        if why is not None:
            return why
    return None


def brought_attackers(specs: list[str]) -> list[str]:
    """Attackers the suite's defenses bring for themselves (a defense's ``attackers``: a plugin's adaptive
    attackers), in spec order; the stage scores them on *every* row, the undefended one included, so a row's
    recovery is never compared against rows that a stronger attacker did not try."""
    return list(dict.fromkeys(n for s in specs for d in DefensePipeline.parse(s).items for n in type(d).attackers))


def stage_defenses(loaded, cfg: dict, results: dict) -> dict:
    """Run the grid; returns rows for the report (see the module docstring)."""
    check_specs(cfg.get("defenses", ["none"]), int(loaded.hidden_size), "[defenses] spec")  # before any work
    sset = ScoredSetConfig.from_suite(cfg)
    depths = [int(a) for a in cfg.get("head_depths", [2])]
    split_specs = [s for s in cfg.get("defenses", []) if s.startswith("random-split")]
    extra = sorted({d for s in split_specs for d in DefensePipeline.parse(s).get("random-split").depths} - set(depths))
    tail = int(cfg.get("tail_layers", 2))
    specs = [s for s in cfg.get("defenses", ["none"]) if s not in split_specs]
    attackers = list(cfg.get("attackers", ["vocab-match-adaptive", "linear-probe"]))
    attackers += [n for n in brought_attackers(specs) if n not in attackers]
    options = {k: dict(v) for k, v in cfg.get("options", {}).items()}
    corpora, max_length = list(cfg.get("corpora", ["prose"])), int(cfg.get("max_length", 128))
    seed, n_boot = int(results["config"]["seed"]), int(cfg.get("n_boot", 1000))
    shard = Shard.of(results)
    t0 = time.perf_counter()
    jobs = [(a, s) for s in specs for a in depths]  # spec-major: a time budget drops whole specs, not a depth
    # taps at the depths this shard uses only: its jobs' and, in shard 0, the random-split rows' (same taps)
    mine = {a for j, (a, _) in enumerate(jobs) if shard.mine(j)} | set(extra + depths if shard.first else [])
    tap_depths = [a for a in depths + extra if a in mine] or depths[:1]
    grid, data = grid_data(loaded, cfg, tap_depths, seed, sset)
    heads = {a: Boundary("head", a) for a in tap_depths}
    train, clean_test = ({a: part[b] for a, b in heads.items()} for part in (data.train, data.test))
    splits = [random_split_row(loaded, s, train, clean_test, seed, options.get("linear-probe"))
              for s in split_specs] if shard.first else []
    for r in splits:
        add_metric(results, f"defenses/{r['defense']}", "depth_id_sequence_acc",
                   metric(r["sequence_acc"], n=r["sequences"], higher_is_better=False, kind="accuracy"))
        for key, m in ((k, r[k]) for k in ("end_to_end_top1", "known_depth_top1")):
            add_metric(results, f"defenses/{r['defense']}", key,
                       metric(m["value"], m["ci_low"], m["ci_high"], m["n"], False, kind="accuracy"))
    texts = {"sequences": chat_form_sequences(loaded, corpora, int(cfg.get("utility_positions", 2000)),
                                              max_length, seed),
             "prompts": held_out_prompts(loaded, corpora, int(cfg.get("greedy_prompts", 10)), seed)}
    cache, out_rows, overhead, preds = {}, [], [], {}
    budget = float(cfg.get("time_budget_s", float("inf")))
    ks = [int(k) for k in cfg.get("paired_k", [])]
    adapters = tempfile.TemporaryDirectory(prefix="splitinfer-adapters-")  # private adapters are secrets: removed
    workdir = adapters.name
    skipped = []
    for j, (a, spec) in enumerate(tqdm(jobs, desc="defenses", unit="config")):
        if not shard.mine(j):
            continue
        if time.perf_counter() - t0 > budget:  # the suite's time budget: report what was left out
            skipped.append(f"{Boundary('head', a)} {spec}")
            continue
        try:
            tj = time.perf_counter()
            # pclip, shaped-noise and denoise are calibrated on the training split
            pipe = calibrate(loaded, spec_pipeline(spec, train[a]), a, tail, train[a], seed, corpora, max_length)
            test = clean_test[a]
            pipe = with_trained_adapter(loaded, pipe, a, corpora, seed, workdir)
            if pipe.model_items:  # a private head: the victim's states come from its own layers (same sequences)
                test = as_public(test_pool(victim_model(loaded, pipe, a), grid, [heads[a]])[heads[a]], loaded)
            clean = take(test, data.chosen[heads[a]])
            target = defend_taps(clean, pipe)
            pairs = _deployment_pairs(loaded, cfg, pipe, a, ks) if pipe.model_items and ks else None
            run = f"defenses/{Boundary('head', a)}/{public_label(pipe)}"
            tried = []
            for n in (n for n in attackers if applies(get_attack_class(n), pipe)):  # each where it applies
                try:
                    tried += _attack(loaded, n, options.get(n, {}), pipe, train[a], target, seed, run, preds, pairs,
                                     n_boot, clean, test)
                except Exception as e:  # noqa: BLE001 - one failed attacker leaves the others' scores intact
                    why = droppable("attack", n, e)
                    if why is None:
                        raise
                    record_failure(results, "defenses", "attack", f"{n}@{Boundary('head', a)}/{spec}", why)
            if pipe.get("lora-adv") is not None:  # fresh attackers on the fixed adapter's own states
                own, _ = split_taps(victim_model(loaded, pipe, a), cfg, [a], "train",
                                    int(cfg.get("train_tokens", 4000)) // len(corpora))
                tried += disclosed_attackers(loaded, pipe, attackers, options, as_public(own[a], loaded), target,
                                             seed, run, preds, n_boot)
            if not any("k" not in x for x in tried):  # every attacker failed (each listed as failed)
                continue
            best = strongest(tried)
            gaps_to_strongest(tried, best, n_boot, seed)
            row = {"job": j, "depth": a, "defense": public_label(pipe),
                   "family": "+".join(d.name for d in pipe.items) or "none",  # pclip+denoise: its own curve
                   "strength": {d.name: d.strength_value() for d in pipe.items}, "describe": pipe.describe(),
                   "attackers": tried, "best": best,
                   "scored_set": dict(zip(("tokens", "documents"), set_size(target))),
                   **cell_utility(loaded, a, tail, pipe, cfg, texts, cache, seed)}
        except Exception as e:  # noqa: BLE001 - a failed defense is left out and listed, never half-recorded
            why = _droppable_defense(spec, e)
            if why is None:
                raise
            record_failure(results, "defenses", "defense", f"{spec}@{Boundary('head', a)}", why)
            continue
        out_rows.append({**row, "job_seconds": time.perf_counter() - tj})
        _record(results, run, row)
    adapters.cleanup()
    d = loaded.hidden_size
    for spec in cfg.get("overhead", []) if shard.first else []:
        for tokens in (1, 8):
            overhead.append({"defense": spec, "d": d, "tokens": tokens, "ms": overhead_ms(spec, d, tokens)})
    for o in overhead:
        add_metric(results, f"defenses/overhead/{o['defense']}/T{o['tokens']}", "ms_per_step",
                   metric(o["ms"], higher_is_better=False, kind="info", unit="ms"))
    return {"rows": [summarise_row(r) for r in out_rows], "random_split": splits, "overhead": overhead,
            "hidden_size": d, "seconds": time.perf_counter() - t0, "skipped": skipped, "attacker_options": options,
            "scored_set": asdict(sset), "elsewhere": rows_elsewhere(cfg), "predictions": preds}


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def _baseline_lines(rows: list[dict]) -> list[str]:
    """Per depth, the activation-free baselines (user text) of the widest-scored attacker of the undefended row,
    or of any row at that depth when the run (a shard) has none: they depend on the scored tokens only."""
    out = []
    for a in sorted({r["depth"] for r in rows}):
        at = [r for r in rows if r["depth"] == a]
        tried = [x for r in ([r for r in at if r["defense"] == "none"] or at) for x in r["attackers"]
                 if "baseline_uniform_top1" in x]
        if tried:
            x = max(tried, key=lambda x: x["top1"]["n"])
            out.append(f"- head {a}, on the {x['top1']['n']} tokens {x['attack']} is scored on: " + baseline_line(x))
    return ["", "Baselines beside the table:", "", *out] if out else []


def defenses_section(data: dict, out) -> list[str]:
    """Markdown for the report, and the frontier plots (one per depth) written under ``out``."""
    from benchmarks.defenses_answers import answers_section
    from benchmarks.defenses_noise import noise_lines
    from benchmarks.plots_defenses import plot_frontier, plot_speed

    data = {**data, "rows": with_undefended_gaps(data.get("rows", []))}  # paired, from per-document counts
    rows = data["rows"]
    sset = data.get("scored_set")
    size = (f" (per cell: {sset['user_tokens']} user-text tokens from each of up to {sset['docs_per_corpus']} "
            f"documents per corpus, floor {sset['min_tokens']} tokens from {sset['min_documents']} documents)"
            if sset else "")
    if bool(sset) or not rows or any("scored_set" in r for r in rows):
        scoring = ("Recovery: the strongest attacker's top-1 on the victim's defended held-out states; every attacker "
                   "of a cell is scored on exactly the cell's scored set" + size + ": held-out, de-duplicated user "
                   "text of every corpus, chat user turns included, template and special positions public and scored "
                   "apart. ")
        utility = ("Utility against the undefended model on held-out chat-form text (the model's template and "
                   "special tokens), intervals over sequences and prompts")
        caption = "Every attacker on the cell's scored set"
    else:  # results written before the common scored set: say how they were scored, not how new ones are
        scoring = ("Recovery: the strongest attacker's top-1 on the victim's defended held-out states. These results "
                   "predate the common scored set: each attacker was scored on its own tokens (the matcher on "
                   "sequence prefixes, learned attackers on every test token; n in the table), so two attackers "
                   "compare only where their n match, and paired differences are absent (-). ")
        utility = ("Utility against the undefended model as the run measured it (positions and prompts in the table; "
                   "a figure without an interval was measured before intervals were)")
        caption = "Every attacker, each on its own tokens"
    lines = ["## Defenses against adaptive attackers", "",
             scoring + "Attackers know the mechanism and its public parameters, not its draws or secret weights. "
             "Differences (defended minus undefended, strongest minus each other attacker) are paired bootstraps "
             "over documents; * marks an interval that excludes 0. " + utility + "; cost measured under the "
             "defense (tok/s modelled at 80 ms, 100 Mbit/s).", "", SCOPE, "",
             *recovery_table(rows), "", caption + " (top-1 % [95% CI]):", "",
             *attackers_table(rows), "", "Utility and cost:", "", *utility_table(rows)]
    lines += _baseline_lines(rows)
    if data.get("attacker_options"):
        lines += ["", "Attacker options (the suite's, over each recipe's defaults): " + "; ".join(
            f"{n}: " + ", ".join(f"{k}={v}" for k, v in o.items()) for n, o in data["attacker_options"].items()) + "."]
    if data.get("elsewhere") and data["elsewhere"]["cells"]:
        e = data["elsewhere"]
        lines += ["", f"Cells measured only in the `{e['suite']}` suite (this suite keeps fewer rows at the same "
                      f"sample sizes): {', '.join(e['cells'])}."]
    if data.get("skipped"):
        lines += ["", f"Left out by the stage's time budget: {', '.join(data['skipped'])}."]
    lines += noise_lines(data)  # sigma beside noise norm, SNR, composed epsilon, and a verdict in words
    for r in data.get("random_split", []):
        lines += ["", f"Random split `{r['defense']}` ({r['threat_model']}): depth-id names the session's depth "
                      f"for {_pct(r['sequence_acc'])}% of {r['sequences']} sessions ({_pct(r['token_acc'])}% of "
                      f"single states; chance {_pct(r['chance'])}%), sessions per depth "
                      + ", ".join(f"{k}: {v}" for k, v in sorted(r['drawn'].items(), key=lambda kv: int(kv[0]))) + "."]
        if "end_to_end_top1" in r:
            e, k = r["end_to_end_top1"], r["known_depth_top1"]
            lines += ["", f"End to end ({r['recovery_threat_model']}): {_pct(e['value'])}% "
                          f"[{_pct(e['ci_low'])}, {_pct(e['ci_high'])}] of user-text tokens recovered, n={e['n']}; "
                          f"told the true depth, the same probes recover {_pct(k['value'])}% "
                          f"[{_pct(k['ci_low'])}, {_pct(k['ci_high'])}]."]
    if data.get("overhead"):
        lines += ["", "| wire defense | d | tokens/step | ms per step (both directions) |", "|---|---|---|---|"]
        lines += [f"| `{o['defense']}` | {o['d']} | {o['tokens']} | {o['ms']:.3f} |" for o in data["overhead"]]
    lines += [""] + answers_section(data)
    figs = [(a, plot_frontier([r for r in rows if r["depth"] == a], out / f"defenses_frontier_head{a}.png", a))
            for a in sorted({r["depth"] for r in rows})]
    lines += [""] + [f"![Defense frontier, head depth {a}]({p.name})" for a, p in figs if p is not None] + [""]
    speed = plot_speed(rows, out / "defenses_speed.png")  # recovery vs tok/s at 80 ms, CPU and GPU-like costs
    lines += [f"![Privacy vs speed (utility floor: 90% agreement)]({speed.name})", ""] if speed is not None else []
    return lines
