"""Harness stage ``defenses``: head depth x defense x strength x adaptive attacker, with utility and cost.

For every head depth and defense spec of the suite it measures, side by side
(DESIGN.md section 8):

- recovery: each attacker on the victim's defended held-out states (teacher-
  forced taps of the test split through :func:`attacks.defended.victim_model`
  and :func:`attacks.defended.defend_taps`); attackers are adaptive: they know
  the mechanism and its public parameters, train on their own defended pairs
  (:func:`attacks.defended.attacker_view`, other noise draws) made with the
  *public* weights. ``vocab-match-adaptive`` is scored on sequence prefixes
  (:func:`attacks.recipes.vocab_match.scoring_subset`), the others on every
  test token and, for the comparison, on those prefixes too: the best attacker
  is the one with the highest top-1 on the tokens every attacker is scored on;
  its top-1 on its own scope (95% bootstrap CI over documents) is the recovery.
- utility: next-token agreement (argmax) and perplexity of the defended split
  on held-out sequences against the undefended model, teacher-forced through
  the real runtime (:meth:`SplitModel.forward_step`, the defense on the wire);
  greedy identity: mean share of the undefended greedy output reproduced
  before the first divergence, on the suite's prompts.
- cost: bytes per decode step (measured frames, sequential), tau of
  ``combined`` under the defense, and tok/s of that run modelled at 80 ms RTT
  and 100 Mbit/s (:func:`splitinfer.timing.fit` then ``project``).

``random-split`` specs are rows of their own (:mod:`benchmarks.defenses_random_split`: depth identification
from the states alone, then end-to-end recovery). Test splits of long documents are cut to >= 10 documents per
corpus (:func:`benchmarks.attack_grid.extract_split`), as in the attack grid.

A noise spec without ``clip=`` gets the median per-token L2 norm of the public
model's training states at that depth (positions >= 1), recorded in its label.
``overhead`` times the wire defenses alone per step at the model's width.

Under ``bench run --shard I/N`` (:mod:`benchmarks.shard`) the stage runs the
(depth, spec) configurations numbered ``j % N == I`` in the grid's order (rows
carry ``job = j``); ``random-split`` rows and the overhead timings run in shard 0.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time

import numpy as np
import torch
from tqdm import tqdm

from attacks.defended import as_public, attacker_view, defend_taps, show_cloud, victim_model
from attacks.evaluate import prior_from_taps, score
from attacks.recipes.vocab_match import scoring_subset
from attacks.registry import get_attack_class, make_attack
from attacks.tapdata import Taps
from attacks.boundary import Boundary
from benchmarks.prompts import PROMPTS
from benchmarks.attack_grid import Victim, extract_split, row_threat_model
from benchmarks.attack_tables import SCOPE, baseline_line, cell
from benchmarks.defenses_adv import disclosed_attackers
from benchmarks.defenses_calibrate import calibrate
from benchmarks.defenses_private import paired_label, public_label, with_trained_adapter
from benchmarks.defenses_overhead import overhead_ms
from benchmarks.defenses_random_split import random_split_row
from benchmarks.schema import add_metric, metric
from benchmarks.shard import Shard
from splitinfer.client import SplitModel
from splitinfer.defenses import DefensePipeline, check_specs
from splitinfer.defenses.base import format_items
from splitinfer.timing import fit

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


def median_clip(train: Taps) -> float:
    """noise's default clip C: the median per-token L2 norm of the states at positions >= 1, to 2 decimals."""
    pos = train.positions()
    return round(float(np.median(np.linalg.norm(np.asarray(train.hidden[pos >= 1], dtype=np.float32), axis=1))), 2)


def utility_sequences(held: Taps, n: int) -> list[list[int]]:
    """The token ids of the first ``n`` held-out sequences: the ones utility is measured on."""
    return [held.token_ids[s].tolist() for _, s in list(held.sequences())[:n]]


def _pipeline(spec: str, train: Taps) -> DefensePipeline:
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


def _common_tokens(attackers: list[str], options: dict) -> int | None:
    """The prefix size every attacker is also scored on (the first prefix-scored attacker's), None if none is."""
    first = next((n for n in attackers if get_attack_class(n).scoring == "prefixes"), None)
    return None if first is None else int(options.get(first, {}).get("scored_tokens", 32))


def _best(tried: list[dict]) -> dict:
    """The strongest attacker without deployment pairs, by top-1 on the tokens every attacker is scored on."""
    return max((x for x in tried if "k" not in x), key=lambda r: r["common_top1"]["value"])


def _attack(loaded, name: str, opts: dict, pipe: DefensePipeline, train: Taps, test: Taps, rows: dict,
            seed: int, pairs: dict[int, Taps] | None = None, common: int | None = None) -> list[dict]:
    """The attacker fitted on its own defended public-model pairs and scored on the victim's states (and on the
    ``common`` prefix tokens per corpus every attacker is scored on); with ``pairs`` ({k: k deployment pairs}) a
    token classifier is also fine-tuned on each k (``paired``, DESIGN.md 4)."""
    own = attacker_view(pipe)
    hp = dict(opts)
    cls = get_attack_class(name)
    if getattr(cls, "adaptive", False):  # it is told the defense's public part
        hp["defense"] = format_items(pipe.items, public=True)
    prefixes = cls.scoring == "prefixes"  # costly per token: scored on sequence prefixes
    size = int(hp.pop("scored_tokens", 32))
    target = scoring_subset(test, rows, size, 0) if prefixes else test
    atk = make_attack(name, model=loaded, seed=seed, **hp)
    t0 = time.perf_counter()
    atk.fit(defend_taps(train, own))
    show_cloud(atk, loaded, pipe, int(test.meta["depth"]))  # permute: the cloud's own transformed weights
    vocab, prior = int(loaded.config.vocab_size), prior_from_taps(train)
    inv = atk.invert(target, k=5)
    m = score(inv, target, vocab_size=vocab, prior=prior)
    fitted = {k: v for k, v in inv.info.items() if k.startswith("adapter_") and isinstance(v, (bool, int, float))}
    on = m if common is None or (prefixes and size == common) else \
        score(atk.invert(both := scoring_subset(test, rows, common, 0), k=5), both, vocab_size=vocab, prior=prior)
    out = [{"attack": name, "threat_model": _threat(name, pipe), "metrics": m, "seconds": time.perf_counter() - t0,
            "test_tokens": target.n_tokens, "common_top1": on["token_acc_top1"], **fitted}]  # vocab-match-fitted
    if pairs and hasattr(atk, "fine_tune"):
        public = {k: v.clone() for k, v in atk.module.state_dict().items()}
        for k, known in sorted(pairs.items()):
            t1 = time.perf_counter()
            atk.module.load_state_dict(public)
            used = atk.fine_tune(known) if k else 0
            m = m if not k else score(atk.invert(target, k=5), target, vocab_size=vocab, prior=prior)
            kept = bool(k) and bool(atk.fit_report.get("paired_kept_public"))  # validation kept the public fit
            out.append({"attack": f"{name}+paired", "k": k, "pairs_used": used, "kept_public": kept, "metrics": m,
                        "threat_model": paired_label(out[0]["threat_model"], k) if k else out[0]["threat_model"],
                        "seconds": time.perf_counter() - t1, "test_tokens": target.n_tokens})
    return out


@torch.no_grad()
def defended_utility(loaded, depth: int, tail: int, pipe: DefensePipeline, seqs: list[list[int]]) -> dict:
    """Next-token agreement and perplexity of the defended split vs the undefended model (teacher-forced)."""
    sm = SplitModel(loaded, f"{depth},{tail}", defense=pipe)
    agree, nll_d, nll_c, n = 0, 0.0, 0.0, 0
    for seq in seqs:
        ids = torch.tensor([seq])
        clean = loaded.model(ids).logits[0].float()  # (T, V)
        sm.remote.open()
        try:
            logits, _ = sm.forward_step(sm.head.new_cache(), sm.tail.new_cache(), seq, list(range(len(seq))))
        finally:
            sm.remote.close()
        nxt = ids[0, 1:]
        agree += int((logits[:-1].argmax(-1) == clean[:-1].argmax(-1)).sum())
        nll_d += float(torch.nn.functional.cross_entropy(logits[:-1], nxt, reduction="sum"))
        nll_c += float(torch.nn.functional.cross_entropy(clean[:-1], nxt, reduction="sum"))
        n += len(seq) - 1
    return {"next_token_agreement": agree / max(1, n), "perplexity": math.exp(nll_d / max(1, n)),
            "perplexity_undefended": math.exp(nll_c / max(1, n)), "positions": n}


def _cost(loaded, depth: int, tail: int, pipe: DefensePipeline, cfg: dict, reference: dict) -> dict:
    """Greedy identity against the undefended split, bytes per step, tau of combined, modelled tok/s at 80 ms."""
    prompts = [PROMPTS[c][0] for c in cfg.get("categories", ["conversational"])]
    tokens = int(cfg.get("tokens", 24))
    sm = SplitModel(loaded, f"{depth},{tail}", defense=pipe)
    chat = loaded.has_chat_template
    share, bytes_step = [], []
    for p in prompts:
        res = sm.generate(p, tokens, chat=chat)
        ref = reference.setdefault((depth, p), SplitModel(loaded, f"{depth},{tail}").generate(p, tokens, chat=chat))
        same = next((i for i, (a, b) in enumerate(zip(res.token_ids, ref.token_ids)) if a != b),
                    min(len(res.token_ids), len(ref.token_ids)))
        share.append(same / max(1, len(ref.token_ids)))
        bytes_step.append(res.decoding_summary()["bytes_per_step"])
    opts = dict(cfg.get("decoding_options", {}).get("combined", {}))
    comb = [sm.generate(p, tokens, chat=chat, decoding="combined", decoding_options=opts) for p in prompts]
    steps = [s for r in comb for s in r.steps[1:]]
    model = fit([s for r in comb for s in r.steps], 0.0, None).project(80.0, 100.0)
    return {"greedy_identity": float(np.mean(share)), "greedy_prompts": len(prompts),
            "bytes_per_step": float(np.mean(bytes_step)),
            "tau_combined": sum(len(r.token_ids) for r in comb) / max(1, sum(len(r.steps) for r in comb)),
            "modelled_tok_s_80ms": model.tok_s(steps)}


def _record(results: dict, run: str, row: dict) -> None:
    best = row["best"]["metrics"]["token_acc_top1"]
    add_metric(results, run, "recovery_top1", metric(best["value"], best["ci_low"], best["ci_high"], best["n"],
                                                     False, kind="accuracy"))
    for key, n in (("next_token_agreement", "positions"), ("greedy_identity", "greedy_prompts")):
        add_metric(results, run, key, metric(row[key], n=row.get(n), higher_is_better=True, kind="accuracy"))
    for key, better in (("perplexity", False), ("bytes_per_step", False), ("tau_combined", True),
                        ("modelled_tok_s_80ms", True)):
        add_metric(results, run, key, metric(row[key], higher_is_better=better, kind="info"))
    for a in row["attackers"]:
        m = a["metrics"]["token_acc_top1"]
        add_metric(results, f"{run}/{a['attack']}" + (f"/k={a['k']}" if "k" in a else ""), "token_acc_top1",
                   metric(m["value"], m["ci_low"], m["ci_high"], m["n"], False, kind="accuracy"))


def stage_defenses(loaded, cfg: dict, results: dict) -> dict:
    """Run the grid; returns rows for the report (see the module docstring)."""
    check_specs(cfg.get("defenses", ["none"]), int(loaded.hidden_size), "[defenses] spec")  # before any work
    depths = [int(a) for a in cfg.get("head_depths", [2])]
    split_specs = [s for s in cfg.get("defenses", []) if s.startswith("random-split")]
    extra = sorted({d for s in split_specs for d in DefensePipeline.parse(s).get("random-split").depths} - set(depths))
    tail = int(cfg.get("tail_layers", 2))
    specs = [s for s in cfg.get("defenses", ["none"]) if s not in split_specs]
    attackers = list(cfg.get("attackers", ["vocab-match-adaptive", "linear-probe"]))
    options = {k: dict(v) for k, v in cfg.get("options", {}).items()}
    n_corp = len(cfg.get("corpora", ["prose"]))
    seed = int(results["config"]["seed"])
    shard = Shard.of(results)
    t0 = time.perf_counter()
    train, _ = split_taps(loaded, cfg, depths + extra, "train", int(cfg.get("train_tokens", 4000)) // n_corp)
    clean_test, rows = split_taps(loaded, cfg, depths + extra, "test", int(cfg.get("test_tokens", 800)) // n_corp)
    splits = [random_split_row(loaded, s, train, clean_test, seed, options.get("linear-probe"))
              for s in split_specs] if shard.first else []
    for r in splits:
        add_metric(results, f"defenses/{r['defense']}", "depth_id_sequence_acc",
                   metric(r["sequence_acc"], n=r["sequences"], higher_is_better=False, kind="accuracy"))
        for key in ("end_to_end_top1", "known_depth_top1"):
            m = r[key]
            add_metric(results, f"defenses/{r['defense']}", key,
                       metric(m["value"], m["ci_low"], m["ci_high"], m["n"], False, kind="accuracy"))
    seqs = utility_sequences(clean_test[depths[0]], int(cfg.get("utility_sequences", 4)))
    reference: dict = {}
    out_rows, overhead = [], []
    jobs = [(a, s) for s in specs for a in depths]  # spec-major: a time budget drops whole specs, not a depth
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
        tj = time.perf_counter()
        pipe = calibrate(loaded, _pipeline(spec, train[a]), a, tail, train[a], seed)  # pclip, shaped-noise, denoise
        test = clean_test[a]
        pipe = with_trained_adapter(loaded, pipe, a, cfg.get("corpora", ["prose"]), seed, workdir)
        if pipe.model_items:  # a private head: the victim's states come from its own layers
            test, _ = split_taps(victim_model(loaded, pipe, a), cfg, [a], "test",
                            int(cfg.get("test_tokens", 800)) // n_corp)
            test = as_public(test[a], loaded)
        test = defend_taps(test, pipe)
        pairs = _deployment_pairs(loaded, cfg, pipe, a, ks) if pipe.model_items and ks else None
        tried = [x for n in attackers for x in _attack(loaded, n, options.get(n, {}), pipe, train[a], test, rows[a],
                                                       seed, pairs, _common_tokens(attackers, options))]
        if pipe.get("lora-adv") is not None:  # fresh attackers on the fixed adapter's own states
            own, _ = split_taps(victim_model(loaded, pipe, a), cfg, [a], "train",
                                int(cfg.get("train_tokens", 4000)) // n_corp)
            tried += disclosed_attackers(loaded, pipe, attackers, options, as_public(own[a], loaded), test, rows[a],
                                         seed, _common_tokens(attackers, options))
        best = _best(tried)
        row = {"job": j, "depth": a, "defense": public_label(pipe),
               "family": "+".join(d.name for d in pipe.items) or "none",  # pclip+denoise: its own curve
               "strength": {d.name: d.strength_value() for d in pipe.items}, "describe": pipe.describe(),
               "attackers": tried, "best": best, **defended_utility(loaded, a, tail, pipe, seqs),
               **_cost(loaded, a, tail, pipe, cfg, reference)}
        out_rows.append({**row, "job_seconds": time.perf_counter() - tj})
        _record(results, f"defenses/{Boundary('head', a)}/{row['defense']}", row)
    adapters.cleanup()
    d = loaded.hidden_size
    for spec in cfg.get("overhead", []) if shard.first else []:
        for tokens in (1, 8):
            overhead.append({"defense": spec, "d": d, "tokens": tokens, "ms": overhead_ms(spec, d, tokens)})
    for o in overhead:
        add_metric(results, f"defenses/overhead/{o['defense']}/T{o['tokens']}", "ms_per_step",
                   metric(o["ms"], higher_is_better=False, kind="info", unit="ms"))
    return {"rows": [_summary(r) for r in out_rows], "random_split": splits, "overhead": overhead,
            "seconds": time.perf_counter() - t0, "skipped": skipped, "attacker_options": options}


def _summary(row: dict) -> dict:
    """A grid row for the report: attacker metrics cut to top-1 (user text), template top-1, baselines and lift."""
    def short(x: dict) -> dict:
        m = x["metrics"]
        keep = {k: m[k] for k in ("template_token_acc_top1", "lift_token_acc_top1", "baseline_uniform_top1",
                                  "baseline_unigram_top1", "baseline_position_top1") if k in m}
        return {"attack": x["attack"], "threat_model": x["threat_model"], "top1": m["token_acc_top1"], **keep,
                **{k: x[k] for k in ("k", "pairs_used", "kept_public", "common_top1") if k in x},
                **{k: v for k, v in x.items() if k.startswith("adapter_")},
                **({"seconds": x["seconds"], "test_tokens": x["test_tokens"]} if "seconds" in x else {})}

    return {**{k: v for k, v in row.items() if k not in ("attackers", "best")},
            "attackers": [short(x) for x in row["attackers"]], "best": short(row["best"])}


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
    from benchmarks.plots_defenses import plot_frontier

    rows = data.get("rows", [])
    lines = ["## Defenses against adaptive attackers", "",
             "Recovery: the best attacker's top-1 on the victim's defended held-out states (95% CI over "
             "documents); attackers know the mechanism and its public parameters, not its draws or secret weights. "
             "Utility against the undefended model; cost measured under the defense (tok/s modelled at 80 ms, "
             "100 Mbit/s). vocab-match-adaptive is scored on sequence prefixes of the test documents, learned "
             "attackers on every test token (n = user-text tokens scored: a prefix of a chat document that holds "
             "only the chat template adds none); the best attacker is the one with the highest top-1 on the "
             "prefixes every attacker is scored on.", "", SCOPE, "",
             "| depth | defense | best attacker (threat model) | recovery top-1 [CI] | lift over strongest baseline | "
             "template top-1 | next-token agreement | perplexity (undefended) | greedy identity | bytes/step | "
             "tau combined | tok/s @80 ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r["best"]["top1"]
        lines.append(f"| {r['depth']} | `{r['defense']}` | {r['best']['attack']} ({r['best']['threat_model']}) | "
                     f"{_pct(b['value'])} [{_pct(b['ci_low'])}, {_pct(b['ci_high'])}] n={b['n']} | "
                     f"{cell(r['best'].get('lift_token_acc_top1'), signed=True)} | "
                     f"{cell(r['best'].get('template_token_acc_top1'))} | "
                     f"{_pct(r['next_token_agreement'])} | {r['perplexity']:.2f} ({r['perplexity_undefended']:.2f}) | "
                     f"{_pct(r['greedy_identity'])} | {r['bytes_per_step']:.0f} | {r['tau_combined']:.2f} | "
                     f"{r['modelled_tok_s_80ms']:.2f} |")
    lines += _baseline_lines(rows)
    if data.get("attacker_options"):
        lines += ["", "Attacker options (the suite's, over each recipe's defaults): " + "; ".join(
            f"{n}: " + ", ".join(f"{k}={v}" for k, v in o.items()) for n, o in data["attacker_options"].items()) + "."]
    if data.get("skipped"):
        lines += ["", f"Left out by the stage's time budget: {', '.join(data['skipped'])}."]
    guarantees = sorted({g for r in rows for g in r["describe"] if "DP per released vector" in g})
    if guarantees:
        lines += ["", "Noise guarantees (opacus RDP accountant, per released vector):", ""] + [f"- {g}" for g in
                                                                                              guarantees]
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
    return lines
