"""Markdown tables of the defenses grid: recovery per cell, every attacker side by side, utility with intervals.

Rows are the stage's summaries (:func:`benchmarks.stage_defenses.stage_defenses`).
Recovery is the strongest attacker's user-text top-1 on the cell's scored set
(:mod:`benchmarks.scored_set`; every attacker of the cell scored on exactly
that set, :mod:`benchmarks.grid_cell`); differences (defended minus
undefended, strongest minus each other attacker) are paired bootstraps over
documents. Rows written before the scored set and the utility intervals
existed print ``-`` where they lack a field.
"""

from __future__ import annotations

from typing import Any

from benchmarks.attack_tables import cell, diff_cell
from benchmarks.defense_utility import denoiser_gains
from benchmarks.defenses_speed import measured_tok_s

__all__ = ["recovery_table", "attackers_table", "utility_table"]


def _n(r: dict[str, Any]) -> str:
    s = r.get("scored_set")
    return f"{s['tokens']} / {s['documents']}" if s else str(r["best"]["top1"]["n"])


def recovery_table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| depth | defense | recovery top-1 [95% CI] | strongest attacker (threat model) | vs undefended "
           "(paired) | lift over strongest baseline | template top-1 | scored tokens / documents |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r["best"]
        out.append(f"| {r['depth']} | `{r['defense']}` | {cell(b['top1'])} | {b['attack']} ({b['threat_model']}) | "
                   f"{diff_cell(r.get('vs_undefended')) if r['family'] != 'none' else '(this row)'} | "
                   f"{cell(b.get('lift_token_acc_top1'), signed=True)} | {cell(b.get('template_token_acc_top1'))} | "
                   f"{_n(r)} |")
    return out


def attackers_table(rows: list[dict[str, Any]]) -> list[str]:
    """Every attacker of every cell on the cell's set: top-1 [CI] and the strongest's lead over it (paired)."""
    names = list(dict.fromkeys(x["attack"] + (f" k={x['k']}" if "k" in x else "") for r in rows
                               for x in r["attackers"]))
    out = ["| depth | defense | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for r in rows:
        by = {x["attack"] + (f" k={x['k']}" if "k" in x else ""): x for x in r["attackers"]}
        cells = []
        for n in names:
            x = by.get(n)
            if x is None:
                cells.append("-")
            elif x["attack"] == r["best"]["attack"] and "k" not in x:
                cells.append(f"**{cell(x['top1'])}** (strongest)")
            else:
                cells.append(f"{cell(x['top1'])}; strongest leads by {diff_cell(x.get('gap_to_best'))}"
                             if "k" not in x else cell(x["top1"]))
        out.append(f"| {r['depth']} | `{r['defense']}` | " + " | ".join(cells) + " |")
    return out


def _iv(r: dict[str, Any], key: str, pct: bool = True) -> str:
    m = (r.get("intervals") or {}).get(key)
    if m is None:
        v = r.get(key)
        return "-" if v is None else (f"{100 * v:.1f} [no interval]" if pct else f"{v:.2f} [no interval]")
    if pct:
        return cell(m)
    if m.get("ci_low") is None:
        return f"{m['value']:.2f} [n/a]"
    return f"{m['value']:.2f} [{m['ci_low']:.2f}, {m['ci_high']:.2f}]"


def utility_table(rows: list[dict[str, Any]]) -> list[str]:
    """The utility and cost table, then what each local denoiser wins back over its base row (paired)."""
    out = ["| depth | defense | next-token agreement % [CI] | perplexity [CI] (undefended) | positions / sequences | "
           "greedy identity % [CI] | answer token F1 % [CI] | answer perplexity [CI] | prompts | bytes/step | "
           "tau combined | tok/s @80 ms |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['depth']} | `{r['defense']}` | {_iv(r, 'next_token_agreement')} | "
                   f"{_iv(r, 'perplexity', False)} ({r['perplexity_undefended']:.2f}) | "
                   f"{r.get('positions', '-')} / {r.get('utility_sequences', '-')} | {_iv(r, 'greedy_identity')} | "
                   f"{_iv(r, 'answer_token_f1')} | {_iv(r, 'answer_perplexity', False)} | "
                   f"{r.get('greedy_prompts', '-')} | {r['bytes_per_step']:.0f} | {r['tau_combined']:.2f} | "
                   f"{_tok_s(r)} |")
    gains = denoiser_gains(rows)
    if gains:
        out += ["", "What the local denoiser wins back (next-token agreement of the row minus its base row's, "
                    "points, paired bootstrap over the same utility sequences; * marks an interval that excludes 0):"]
        out += [f"- head {g['depth']}, `{g['defense']}` against `{g['base']}`: {diff_cell(g)} "
                f"({g['sequences']} sequences)" for g in gains]
    return out


def _tok_s(row: dict[str, Any]) -> str:
    """The row's modelled tok/s at 80 ms, or n/a where no decode step was timed (every generation stopped at once)."""
    tok_s = measured_tok_s(row.get("modelled_tok_s_80ms"))
    return "n/a (no decode step)" if tok_s is None else f"{tok_s:.2f}"
