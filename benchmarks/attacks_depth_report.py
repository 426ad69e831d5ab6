"""Markdown report of the per-depth inversion study (:mod:`benchmarks.attacks_depth`)."""

from __future__ import annotations

from typing import Any

from attacks.boundary import Boundary
from benchmarks.attack_seeds import seed_spread
from benchmarks.attack_tables import SCOPE, baseline_line, cell, compare, pii_cell, pii_test_line
from benchmarks.attack_wire import traffic_line
from benchmarks.attacks_depth_changes import changes_section

SEED_BEST_DEEP = 0.348  # the seed's MLP after layer 7 of Mistral-7B
LEARNED = ("linear-probe", "linear-embed", "mlp", "seq-decoder")
SEED_BOUNDARY = str(Boundary("head", 8))  # the depth the seed paper attacks (its deep result, SEED_BEST_DEEP)


def _side(row: dict[str, Any]) -> str:
    """``head`` or ``tail``: the side of a result row's boundary (rows hold it as written in the results)."""
    return Boundary.parse(row["boundary"]).side


def _cell(m: dict[str, Any] | None, signed: bool = False) -> str:
    return cell(m, signed)


def _table(header: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out)


def _grid(rows: list[dict], boundaries: list[str], metric: str, attacks: list[str]) -> str:
    by = {(r["attack"], r["boundary"]): r for r in rows}
    lines = []
    for a in attacks:
        tm = next((r["threat_model"] for r in rows if r["attack"] == a), "")
        cells = [_cell(by[(a, b)]["metrics"].get(metric), metric.startswith("lift_")) if (a, b) in by else "-"
                 for b in boundaries]
        lines.append([f"{a} ({tm})"] + cells)
    return _table(["attack (threat model)"] + [_label(b, rows) for b in boundaries], lines)


def _label(b: str, rows: list[dict]) -> str:
    depth = next((r["depth"] for r in rows if r["boundary"] == b), None)
    return f"{b} (depth {depth})"


def _targets(rows: list[dict], heads: list[str]) -> list[str]:
    by = {(r["attack"], r["boundary"]): r for r in rows}
    out = []
    vm = [by[("vocab-match", b)] for b in heads if ("vocab-match", b) in by]
    if vm:
        worst = min(r["metrics"]["token_acc_top1"]["value"] for r in vm)
        spt = ", ".join(f"{r['boundary']}: {r['seconds_per_token']:.3f}" for r in vm)
        missing = [b for b in heads if ("vocab-match", b) not in by]
        out.append(f"- vocab-match >= 99% at every head depth scored: **{'met' if worst >= 0.99 else 'NOT met'}** "
                   f"(lowest {100 * worst:.1f}%); seconds per token {spt}."
                   + (f" Not scored in this study (CPU budget): {', '.join(missing)}." if missing else ""))
    b8 = SEED_BOUNDARY
    if ("seq-decoder", b8) in by:
        sd = by[("seq-decoder", b8)]["metrics"]["token_acc_top1"]
        parts, beats = [], True
        for other in ("linear-probe", "linear-embed", "mlp"):
            if (other, b8) in by:
                diff = compare(by[("seq-decoder", b8)], by[(other, b8)])
                parts.append(f"minus {other}: {diff}")
                beats &= diff.endswith(", significant") and diff.startswith("+")
        verdict = "above all (paired bootstrap)" if beats else "NOT significantly above all (paired bootstrap)"
        out.append(f"- head depth 8: seq-decoder {_cell(sd)}; difference in top-1 points [95% CI] "
                   f"{'; '.join(parts)}: **{verdict}**.")
    learned = [r for r in rows if r["attack"] in LEARNED and _side(r) == "head"]  # seed: head depth 8
    if learned:
        low = min(learned, key=lambda r: r["metrics"]["token_acc_top1"]["ci_low"] or 0.0)
        ok = (low["metrics"]["token_acc_top1"]["ci_low"] or 0.0) > SEED_BEST_DEEP
        out.append(f"- every properly trained learned attacker above the seed's 34.8% (lower CI bound): "
                   f"**{'met' if ok else 'NOT met'}** (weakest: {low['attack']} at {low['boundary']}, "
                   f"{_cell(low['metrics']['token_acc_top1'])}).")
    return out


def _seeds_section(all_rows: list[dict], first: int, boundaries: list[str]) -> list[str]:
    spread = seed_spread(all_rows, first)
    if not spread:
        return []
    seeds = sorted({r.get("train_seed", first) for r in all_rows})
    lines = [[a, b, f"{100 * v['mean']:.1f}", f"{100 * v['sd']:.1f}", f"{100 * v['min']:.1f} - {100 * v['max']:.1f}",
              ", ".join(f"{100 * x:.1f}" for x in v["values"])]
             for b in boundaries for (a, bb), v in spread.items() if bb == b]
    return ["## Attacker training variance (top-1 %, user text)", "",
            f"Every learned attacker fitted {len(seeds)} times (training seeds {', '.join(map(str, seeds))}) on the "
            f"same data; the tables above show seed {first} with its bootstrap interval over documents, which does "
            "not include this variance.", "",
            _table(["attack", "boundary", "mean", "sd", "min - max", "per seed"], lines), ""]


def markdown(study: dict[str, Any]) -> str:
    """The study as Markdown: sizes, targets, accuracy per depth, seed protocol, output side, PII, depth-id."""
    cfg, all_rows = study["config"], study["rows"]
    first = cfg.get("train_seeds", [cfg["seed"]])[0]
    rows = [r for r in all_rows if r.get("train_seed", first) == first]  # the tables: the first training seed
    heads = [str(Boundary("head", a)) for a in cfg["head_depths"]]
    tails = [str(Boundary("tail", b)) for b in cfg["tail_layers"]]
    head_attacks = [a for a in dict.fromkeys(r["attack"] for r in rows) if any(
        r["attack"] == a and _side(r) == "head" for r in rows)]
    tail_attacks = [a for a in dict.fromkeys(r["attack"] for r in rows) if any(
        r["attack"] == a and _side(r) == "tail" and r.get("leaks", "output") == "output" for r in rows)]
    tail_input = [a for a in dict.fromkeys(r["attack"] for r in rows) if any(
        r["attack"] == a and _side(r) == "tail" and r.get("leaks") == "input" for r in rows)]
    s = [f"# Inversion attacks per split depth: {cfg['model']} ({cfg['num_layers']} layers)", "",
         f"Sizes: {cfg['train_tokens']} train / {cfg['val_tokens']} val / {cfg['test_tokens']} test tokens per corpus "
         f"({', '.join(cfg['corpora'])}; {cfg['train_tokens_total']} / {cfg['val_tokens_total']} / "
         f"{cfg['test_tokens_total']} pooled, {cfg['test_documents']} test documents), at most {cfg['max_doc_tokens']} "
         f"tokens per document, sequences of <= {cfg['max_length']}; vocab-match on the first "
         f"{cfg['vocab_match_tokens'] // 4} tokens of 4 test sequences per corpus"
         + (f" (PII corpora: 2 of them cut at {cfg['vocab_match_pii_tokens']} tokens instead, to cover PII spans)"
            if cfg.get("vocab_match_pii_tokens") else "")
         + (f"; the PII test split sized for >= {cfg['min_pii_spans']} scored spans of every type"
            if cfg.get("min_pii_spans") else "")
         + f". Hyper-parameter overrides: {cfg['hparams']}. Data seed {cfg['seed']}, training seeds "
         f"{', '.join(map(str, cfg.get('train_seeds', [cfg['seed']])))}, "
         f"{cfg['threads']} torch thread(s), device {cfg['device']}. "
         f"Extraction {study['timing']['extract_seconds']} s, "
         f"this run {study['timing']['total_seconds']} s"
         + (f" (it resumed {study['timing']['resumed_jobs']} jobs from its partial file, "
            "whose fit and invert times are in the last table)" if study["timing"].get("resumed_jobs") else "")
         + f"; git {study.get('git', {}).get('hash', '?')}"
         f"{' (dirty tree)' if study.get('git', {}).get('dirty') else ''}"
         + ". Teacher-forced fp16 states of held-out documents "
         "(document-level splits, corpora de-duplicated by normalised text); values are % of tokens.", "",
         SCOPE, "",
         "Threat models (DESIGN.md section 4): white-box (exact) = inverts the published local layers or runs the "
         "published tail; white-box (learned) = trains on its own (state, token) pairs made with the published "
         "weights. Every victim in this study runs the published weights, so no result is shadow (shadow needs a "
         "victim whose local layers were changed privately).", "", "## Targets", ""]
    s += _targets(rows, heads) + [""]
    s += changes_section(rows, cfg)
    base = next((r["metrics"] for r in rows if r["boundary"] == heads[0] and r["attack"] != "vocab-match"), {})
    if base:
        s += [f"Pooled test set: {baseline_line(base)}", ""]
    for metric, title in (("token_acc_top1", "Token accuracy @1, user text"),
                          ("lift_token_acc_top1", "Lift over the strongest baseline (top-1 points, paired bootstrap)"),
                          ("template_token_acc_top1", "Token accuracy @1, chat-template tokens only"),
                          ("coverage", "Coverage: test tokens (user text) seen in training"),
                          ("token_acc_top5", "Token accuracy @5, user text"),
                          ("token_f1", "Token F1 (mean over documents), user text"),
                          ("exact_match", "Exact match (documents), user text"),
                          ("lift_exact_match", "Exact match lift over the strongest baseline")):
        if any(metric in r["metrics"] for r in rows):
            s += [f"## {title}, head boundary (prompt)", "", _grid(rows, heads, metric, head_attacks), ""]
    if tails and tail_attacks:
        scored = sorted({r.get("scored_on", "teacher-forced") for r in rows if r["attack"] in tail_attacks})
        s += ["## Output side (states the body returns): generated tokens recovered, accuracy @1", "",
              "Each attacker guesses, from the state the body returns at a position, the token the user's tail "
              f"generates from it; scored on {' and '.join(scored)} traffic"
              + (f" (up to {cfg.get('wire_tokens')} generated tokens per corpus of real split generation, "
                 "speculative drafts included; learned attackers trained on teacher-forced taps)"
                 if "wire" in scored else "") + ".", "",
              _grid(rows, tails, "token_acc_top1", tail_attacks), ""]
        wire = traffic_line(rows)
        s += [wire, ""] if wire else []
    if tails and tail_input:
        s += ["## Input side read from the states the body returns: token accuracy @1", "",
              "output-probe:current guesses the token the body received at each position from the state it "
              "returns there: prompt leakage, scored on teacher-forced test documents.", "",
              _grid(rows, tails, "token_acc_top1", tail_input), ""]
    seed_rows = {r["boundary"]: r for r in rows if r["attack"] == "mlp-seed"}
    proper = {r["boundary"]: r for r in rows if r["attack"] == "mlp"}
    if seed_rows:
        lines = [[b, f"{100 * seed_rows[b]['info'].get('seed_split_top1', float('nan')):.1f}",
                  _cell(seed_rows[b]["metrics"]["token_acc_top1"]),
                  _cell(proper[b]["metrics"]["token_acc_top1"]) if b in proper else "-"]
                 for b in heads if b in seed_rows]
        s += ["## The seed's MLP protocol beside the proper one", "",
              "Seed protocol: about 880 pairs, random token-level split (its own test split shares documents and "
              "token types with training); proper: all training tokens, held-out documents. The seed paper reported "
              "58.8% / 44.3% / 34.8% after layers 1 / 3 / 7 of Mistral-7B (the outputs of layers[1], [3], [7]: head "
              "depth 2, 4, 8; the full replica of its protocol is in reports/paper_replica/).", "",
              _table(["boundary", "seed protocol, its own split", "seed-protocol model, held-out docs",
                      "proper protocol, held-out docs"], lines), ""]
    vm = [r for r in rows if r["attack"] == "vocab-match"]
    if vm:
        lines = [[r["boundary"], _cell(r["metrics"]["token_acc_top1"]), f"{r['seconds_per_token']:.3f}",
                  f"{100 * r['info'].get('accepted_rate', 0):.1f}", f"{r['info'].get('mean_candidates', 0):.0f}",
                  f"{100 * r['info'].get('gradient_search_rate', 0):.1f}", str(r["test_tokens"])] for r in vm]
        s += ["## vocab-match (white-box, exact)", "", _table(["boundary", "top-1", "s/token", "accepted %",
                                                         "candidates/token", "gradient search %", "tokens"], lines), ""]
    pii = sorted({k[len("pii_recovery_"):] for r in rows for k in r["metrics"] if k.startswith("pii_recovery_")})
    if pii:
        s += ["## PII spans recovered character-exactly (% of spans [95% CI], n spans, pooled test set)", ""]
        sizing = pii_test_line(cfg.get("pii_test"))
        s += [sizing, ""] if sizing else []
        for a in head_attacks + tail_attacks + tail_input:
            bs = [b for b in heads + tails if any(r["attack"] == a and r["boundary"] == b for r in rows)]
            by = {r["boundary"]: r for r in rows if r["attack"] == a}
            lines = [[t] + [pii_cell(by[b]["metrics"].get(f"pii_recovery_{t}")) for b in bs]
                     + [pii_cell(by[bs[0]]["metrics"].get(f"baseline_position_pii_recovery_{t}")) if bs else "-"]
                     for t in pii]
            s += [f"### {a}", "", _table(["type"] + bs + ["position-prior baseline"], lines), ""]
    if study.get("depth_id"):
        lines = [[r["boundary"], str(r["depth"]), r["classifier"], f"{100 * r['token_acc']:.1f}",
                  f"{100 * r['sequence_acc']:.1f}", str(r["sequences"])] for r in study["depth_id"]]
        s += ["## depth-id: identifying the split depth", "",
              "Trained on the training taps of all depths above, scored on the test taps of each; chance is "
              f"{100 / len({r['depth'] for r in study['depth_id']}):.1f}%.", "",
              _table(["boundary", "depth", "classifier", "token acc %", "sequence acc %", "sequences"], lines), ""]
    corp = [r for r in rows if r["boundary"] == SEED_BOUNDARY and r.get("per_corpus_top1")]
    if corp:
        names = list(corp[0]["per_corpus_top1"])
        s += [f"## Per corpus at {SEED_BOUNDARY} (top-1 %, every token: chat-template tokens included)", "",
              _table(["attack"] + names, [[r["attack"]] + [f"{100 * r['per_corpus_top1'][c]:.1f}" for c in names]
                                          for r in corp]), ""]
    s += _seeds_section(all_rows, first, heads + tails)
    timing = [[r["attack"], r["boundary"], str(r.get("train_seed", first)), f"{r['fit_seconds']:.1f}",
               f"{r['invert_seconds']:.1f}"] for r in all_rows]
    s += ["## Time (s)", "", _table(["attack", "boundary", "seed", "fit", "invert"], timing), ""]
    return "\n".join(s)
