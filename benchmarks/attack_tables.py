"""Markdown cells and tables for attack metrics, shared by the suite report and the depth-study report.

Every table states its scope: the un-prefixed metrics are *user text* (turn
content; chat-template tokens excluded), ``template`` columns are the chat
template's tokens alone. Intervals print ``n/a`` where there are fewer than 2
documents; lift is over the strongest activation-free baseline (uniform,
unigram, position prior), with a paired bootstrap interval; attackers are
compared with a paired bootstrap of the difference
(:func:`attacks.evaluate.paired_gap`), not by disjoint intervals.
"""

from __future__ import annotations

from typing import Any

from attacks.evaluate import paired_gap

SCOPE = ("Scope: user text (turn content); chat-template tokens (system prompt, role markers) are excluded and "
         "shown apart in the template column. Intervals: 95%, documents as the unit: Clopper-Pearson over documents "
         "when every token is right or every one wrong, else a bootstrap over documents widened to at least the "
         "exact interval of the pooled tokens and those document bounds (docs/reporting.md); n/a below 2 documents.")


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def cell(m: dict[str, Any] | None, signed: bool = False) -> str:
    """``value [low, high]`` in %, ``value [n/a]`` without an interval, ``-`` when absent."""
    if m is None:
        return "-"
    f = (lambda x: f"{100 * x:+.1f}") if signed else (lambda x: f"{100 * x:.1f}")
    if m.get("ci_low") is None:
        return f"{f(m['value'])} [n/a]"
    return f"{f(m['value'])} [{f(m['ci_low'])}, {f(m['ci_high'])}]"


def diff_cell(d: dict[str, Any] | None) -> str:
    """A paired difference in points with its interval and whether it excludes 0; ``-`` when absent."""
    if d is None:
        return "-"
    if d.get("ci_low") is None:
        return f"{100 * d['value']:+.1f} [n/a]"
    sig = "" if d["ci_low"] <= 0 <= d["ci_high"] else " *"
    return f"{100 * d['value']:+.1f} [{100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f}]{sig}"


def strongest_baseline(metrics: dict[str, Any], k: int = 1) -> tuple[str, float] | None:
    """(name, value) of the strongest top-k baseline among uniform, unigram and position."""
    found = [(name, metrics[f"baseline_{name}_top{k}"]["value"]) for name in ("uniform", "unigram", "position")
             if f"baseline_{name}_top{k}" in metrics]
    return max(found, key=lambda x: x[1]) if found else None


def baseline_line(metrics: dict[str, Any]) -> str:
    """One sentence naming every top-1 baseline (user text) and the template's position-prior score."""
    parts = [f"{name} {cell(metrics.get(f'baseline_{name}_top1'))}" for name in ("uniform", "unigram", "position")
             if f"baseline_{name}_top1" in metrics]
    em = [f"{name} {cell(metrics.get(f'baseline_{name}_exact_match'))}" for name in ("unigram", "position")
          if f"baseline_{name}_exact_match" in metrics]
    out = "Baselines without activations (top-1 %, user text): " + ", ".join(parts)
    if em:
        out += "; exact match: " + ", ".join(em)
    if "template_baseline_position_top1" in metrics:
        out += (f"; the position prior alone recovers {cell(metrics['template_baseline_position_top1'])} of "
                "template tokens")
    return out + "."


def metrics_header() -> list[str]:
    return ["top-1 % [95% CI]", "lift over strongest baseline", "template top-1 %", "coverage %", "top-5 %",
            "token F1 %", "exact match % (lift)", "n tokens / docs"]


def metrics_cells(m: dict[str, Any]) -> list[str]:
    """The cells of :func:`metrics_header` for one summary."""
    best = strongest_baseline(m)
    lift = "-" if "lift_token_acc_top1" not in m else \
        f"{cell(m['lift_token_acc_top1'], signed=True)} vs {best[0] if best else '?'}"
    em = "-" if "exact_match" not in m else pct(m["exact_match"]["value"]) + (
        f" ({100 * m['lift_exact_match']['value']:+.1f})" if "lift_exact_match" in m else "")
    n_tok = m["token_acc_top1"]["n"] if "token_acc_top1" in m else "-"
    n_doc = m["token_f1"]["n"] if "token_f1" in m else "-"
    return [cell(m.get("token_acc_top1")), lift, cell(m.get("template_token_acc_top1")), cell(m.get("coverage")),
            pct(m["token_acc_top5"]["value"]) if "token_acc_top5" in m else "-",
            pct(m["token_f1"]["value"]) if "token_f1" in m else "-", em, f"{n_tok} / {n_doc}"]


def pii_cell(m: dict[str, Any] | None) -> str:
    """PII recovery with its interval and the number of spans scored (n)."""
    return "-" if m is None else f"{cell(m)} (n={m['n']})"


def compare(a: dict[str, Any], b: dict[str, Any], seed: int = 0) -> str:
    """``a - b`` top-1 (user text) with a paired bootstrap CI over their shared documents, from rows' ``doc_top1``."""
    if not a.get("doc_top1") or not b.get("doc_top1"):
        return "n/a (no per-document counts)"
    gap = paired_gap(a, b, seed=seed)
    if gap is None:
        return "n/a (no shared documents)"
    diff, low, high = gap["value"], gap["ci_low"], gap["ci_high"]
    if low is None:
        return f"{100 * diff:+.1f} [n/a]"
    verdict = "significant" if low > 0 or high < 0 else "not significant"
    return f"{100 * diff:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}], {verdict}"


def pii_test_line(pii: dict[str, dict[str, Any]] | None) -> str | None:
    """One sentence per PII corpus: its test tokens, scored spans per type, and spans the document cap cut."""
    if not pii:
        return None
    parts = [f"{c}: {v['test_tokens']} test tokens, scored spans per type "
             + ", ".join(f"{t} {n}" for t, n in v["spans"].items())
             + f"; {v['unscored_spans']} span(s) run past the per-document token cap and are not scored"
             for c, v in pii.items()]
    return "PII test split: " + "; ".join(parts) + "."


def common_set_table(rows: list[dict[str, Any]], seed: int = 0) -> list[str]:
    """Per head depth, every attacker on the depth's common scored set side by side (issue 28 "one grid"): the
    strongest in bold, each other's gap to it a paired bootstrap over documents (``*``: the interval excludes 0).
    Rows without a ``common`` score (output-side attackers, older results) are left out."""
    pooled = [r for r in rows if r.get("corpus") == "all" and r.get("common")]
    names = list(dict.fromkeys(r["attack"] for r in pooled))
    if not pooled:
        return []
    out = ["| depth | scored tokens / docs | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for depth in sorted({r["depth"] for r in pooled}):
        at = {r["attack"]: r["common"] for r in pooled if r["depth"] == depth}
        best = max(at, key=lambda n: at[n]["metrics"]["token_acc_top1"]["value"])
        top = at[best]["metrics"]["token_acc_top1"]
        cells = ["-" if n not in at else f"**{cell(top)}** (strongest)" if n == best else
                 f"{cell(at[n]['metrics']['token_acc_top1'])}; strongest leads by "
                 f"{diff_cell(paired_gap(at[best], at[n], seed=seed))}" for n in names]
        docs = at[best]["metrics"].get("token_f1", {}).get("n", "-")
        out.append(f"| {depth} | {top['n']} / {docs} | " + " | ".join(cells) + " |")
    return out
