"""Markdown report of the learned-attacker ablation (:mod:`benchmarks.attacks_learned`)."""

from __future__ import annotations

from typing import Any

from benchmarks.attack_tables import SCOPE, baseline_line, cell, compare, pct

GOAL = 0.90


def _per_corpus(r: dict[str, Any]) -> str:
    return ", ".join(f"{c} {pct(v)}" for c, v in r["per_corpus_top1"].items())


def _table(ab: dict[str, Any]) -> list[str]:
    probe = ab["rows"][0] if ab["rows"] and ab["rows"][0]["name"] == "linear-probe" else None
    lines = ["| # | row | train tokens | top-1 % [95% CI] | top-5 % | coverage % | vs probe baseline (paired) | "
             "per corpus top-1 % | fit + score s | notes |", "|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(ab["rows"], 1):
        m = r["metrics"]
        notes = []
        info = r.get("info", {})
        if "lam" in info:
            notes.append(f"lam={info['lam']:g}")
        if "base_candidates_topk" in r:
            notes.append(f"base top-5 {cell(r['base_candidates_topk'])}")
        if "epochs_run" in info:
            notes.append(f"{info['epochs_run']} epochs")
        if "restricted_vocab" in info:
            notes.append(f"softmax over {info['restricted_vocab']} tokens while training")
        versus = "-" if probe is None or r is probe else compare(r, probe)
        lines.append(f"| {i} | {r['label']} | {r['train_tokens']} | {cell(m.get('token_acc_top1'))} | "
                     f"{pct(m['token_acc_top5']['value']) if 'token_acc_top5' in m else '-'} | "
                     f"{cell(m.get('coverage'))} | {versus} | {_per_corpus(r)} | {r['seconds']} | "
                     f"{'; '.join(notes)} |")
    return lines


def _verdict(ab: dict[str, Any]) -> list[str]:
    best = max(ab["rows"], key=lambda r: r["metrics"]["token_acc_top1"]["value"])
    top1 = best["metrics"]["token_acc_top1"]
    reached = top1["value"] >= GOAL
    out = [f"- Goal: the best learned attacker reaches >= {100 * GOAL:.0f}% top-1 (user text, pooled, point "
           f"estimate): **{'reached' if reached else 'NOT reached'}**; best: {best['label']}, {cell(top1)}."]
    by_scale: dict[str, list[tuple[int, float]]] = {}
    for r in ab["rows"]:
        if r["name"] in ("linear-probe", "seq-decoder") and "output" not in str(r["options"]):
            frozen = r["options"].get("seq-decoder", {}).get("freeze_skip", True) is not False
            if r["name"] == "seq-decoder" and frozen:
                continue
            by_scale.setdefault(r["name"], []).append((r["train_tokens"],
                                                       r["metrics"]["token_acc_top1"]["value"]))
    for name, pts in by_scale.items():
        if len(pts) > 1:
            out.append(f"- Data curve, {name}" + (" (freeze_skip=False)" if name == "seq-decoder" else "") + ": " +
                       ", ".join(f"{n} tokens: {pct(v)}%" for n, v in sorted(pts)) + ".")
    for r in ab["rows"]:
        if "base_candidates_topk" in r:
            out.append(f"- {r['label']}: {cell(r['metrics']['token_acc_top1'])} from the base's "
                       f"{cell(r['base_top1'])}; the true token is among the base's top 5 for "
                       f"{cell(r['base_candidates_topk'])} of user-text tokens (its top {ab['config']['candidates']}, "
                       f"the beam's candidates, hold at least as many): the ceiling of any re-ranking.")
    return out


def markdown(ab: dict[str, Any], command: str, git_hash: str | None, dirty: bool | None) -> str:
    cfg = ab["config"]
    study = cfg["study"]
    sizes = "; ".join(f"{s}x: {v['train_tokens']} train / {v['val_tokens']} val / {v['test_tokens']} test tokens "
                      f"pooled, {v['test_documents']} test documents" for s, v in cfg["sizes"].items())
    first = ab["rows"][0]["metrics"] if ab["rows"] else {}
    lines = [f"# Learned attackers at {cfg['boundary']}: ablation", "",
             f"Command (from commit {git_hash}{', dirty tree' if dirty else ''}): `OMP_NUM_THREADS=2 {command}`", "",
             f"Model {cfg['model']} (sha256 {cfg['model_sha256'][:12]}...), corpora {', '.join(study['corpora'])}, "
             f"the per-depth study's splits and sizes per corpus ({study['train_tokens']} train x scale, "
             f"{study['val_tokens']} val, {study['test_tokens']} test tokens, <= {study['max_doc_tokens']} tokens per "
             f"document, sequences <= {study['max_length']}), seed {cfg['seed']}. Sizes: {sizes}. "
             f"Extraction {ab['timing']['extract_seconds']} s per scale, total {ab['timing']['total_seconds']} s.",
             "", "Threat model of every row: white-box (learned): trained on (state, token) pairs made with the "
             "public weights, never inverting the local layers at attack time; lm-beam also runs the public model "
             "forward as a language prior.", "", SCOPE, "", baseline_line(first) if first else "", "",
             "## Rows", ""] + _table(ab) + ["", "## What it says", ""] + _verdict(ab) + [""]
    return "\n".join(lines)
