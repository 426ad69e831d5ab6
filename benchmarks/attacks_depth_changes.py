"""The depth study's "what changed" section: each headline number of the report that predates the issue-14 fixes
beside the same number now.

The old report (``reports/attacks_depth/attacks_depth.md`` at commit :data:`BEFORE_COMMIT`) scored every token,
chat-template tokens included, on a chat test set with copies of training documents, had no position prior,
labelled the learned attackers ``shadow``, read the output side with a probe whose ``both`` mode equalled
``current`` (the token the body received: input-side leakage), and trained each attacker once. Its figures are
copied here as they were printed; the new ones are read from the study's rows (first training seed; user text).
"""

from __future__ import annotations

from typing import Any, Callable

BEFORE_COMMIT = "bd7a73d"

Rows = dict[tuple[str, str], dict[str, Any]]


def _top1(attack: str, boundary: str) -> Callable[[Rows], str]:
    return lambda by: _pct(by, attack, boundary, "token_acc_top1")


def _pct(by: Rows, attack: str, boundary: str, name: str) -> str:
    m = by.get((attack, boundary), {}).get("metrics", {}).get(name)
    if m is None:
        return "not run"
    ci = "" if m.get("ci_low") is None else f" [{100 * m['ci_low']:.1f}, {100 * m['ci_high']:.1f}]"
    return f"{100 * m['value']:.1f}{ci}" + (f" (n={m['n']})" if name.startswith("pii_") else "")


def _label(by: Rows) -> str:
    labels = sorted({r["threat_model"] for (a, _), r in by.items() if a in ("linear-probe", "mlp", "seq-decoder")})
    return ", ".join(labels) or "not run"


def _vocab_match(by: Rows) -> str:
    vm = [r for (a, _), r in by.items() if a == "vocab-match"]
    if not vm:
        return "not run"
    low = min(vm, key=lambda r: r["metrics"]["token_acc_top1"]["value"])
    return (f"lowest {100 * low['metrics']['token_acc_top1']['value']:.1f} at "
            f"{', '.join(r['boundary'] for r in vm)} ({vm[0]['test_tokens']} tokens per depth)")


def _baseline(name: str) -> Callable[[Rows], str]:
    def get(by: Rows) -> str:
        r = next((r for (a, b), r in by.items() if b.startswith("head") and a != "vocab-match"), None)
        return "not run" if r is None else _pct({("x", "y"): r}, "x", "y", f"baseline_{name}_top1")
    return get


def _test_set(cfg: dict[str, Any]) -> str:
    return f"{cfg['test_tokens_total']} tokens, {cfg['test_documents']} documents"


HEADLINES: tuple[tuple[str, str, Callable[[Rows], str]], ...] = (
    ("threat label of the learned attackers", "shadow", _label),
    ("vocab-match top-1 (white-box, exact)", "lowest 100.0 at head:1-16 (332 tokens per depth)", _vocab_match),
    ("linear-probe top-1, head:1", "97.7 [97.2, 98.2]", _top1("linear-probe", "head:1")),
    ("linear-probe top-1, head:8", "78.2 [75.4, 81.2]", _top1("linear-probe", "head:8")),
    ("linear-probe top-1, head:16", "72.0 [68.7, 75.7]", _top1("linear-probe", "head:16")),
    ("seq-decoder top-1, head:8", "77.9 [75.0, 80.9]", _top1("seq-decoder", "head:8")),
    ("mlp top-1, head:8", "77.2 [74.3, 80.3]", _top1("mlp", "head:8")),
    ("linear-embed top-1, head:8", "75.0 [72.2, 78.0]", _top1("linear-embed", "head:8")),
    ("mlp-seed (seed protocol) on held-out documents, head:8", "53.6 [49.7, 57.8]", _top1("mlp-seed", "head:8")),
    ("linear-probe exact match (documents), head:8", "18.6 [7.0, 30.2]",
     lambda by: _pct(by, "linear-probe", "head:8", "exact_match")),
    ("linear-probe PII person recovered, head:8", "45.5 [16.7, 75.0] (n=11)",
     lambda by: _pct(by, "linear-probe", "head:8", "pii_recovery_person")),
    ("unigram baseline top-1", "7.2 [5.9, 8.7]", _baseline("unigram")),
    ("position-prior baseline top-1", "not reported", _baseline("position")),
    ("output side, generated token (output-probe, tail:2)", "41.5 [35.5, 49.3] (output-probe:next, teacher-forced)",
     _top1("output-probe", "tail:2")),
    ("output side, generated token (tail-logits, tail:2)", "not reported", _top1("tail-logits", "tail:2")),
    ("input token read from returned states (output-probe:current, tail:2)",
     "66.5 [63.1, 70.8], reported as output leakage (output-probe:both = :current)",
     _top1("output-probe:current", "tail:2")),
)


def changes_section(rows: list[dict[str, Any]], cfg: dict[str, Any]) -> list[str]:
    """Markdown lines: a table of every headline number before (:data:`BEFORE_COMMIT`) and now."""
    by = {(r["attack"], r["boundary"]): r for r in rows}
    lines = [[label, before, get(by)] for label, before, get in HEADLINES]
    lines.insert(0, ["pooled test set", "4000 tokens, 43 documents (8 of 19 chat test documents in training)",
                     _test_set(cfg)])
    out = ["## What changed since the report that predates the issue-14 fixes", "",
           f"Before: `reports/attacks_depth/attacks_depth.md` at commit {BEFORE_COMMIT} (every token scored, "
           "chat-template tokens included, chat test documents copied in training, one training seed, no position "
           "prior, learned attackers labelled shadow, output side read as the input token). Now: this report (user "
           "text only, de-duplicated corpora, first training seed; the spread across seeds is in its own section).",
           "", "| headline | before | now |", "|---|---|---|"]
    return out + ["| " + " | ".join(line) + " |" for line in lines] + [""]
