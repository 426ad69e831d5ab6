"""One cell of the grid: every attacker scored on the same set, the strongest reported, the others beside it.

A cell is (model, head depth, defense); its scored set is
:func:`benchmarks.scored_set.common_set`, and both the attack grid
(:mod:`benchmarks.attack_grid`, defense ``none``) and the defenses stage
(:mod:`benchmarks.stage_defenses`) score through :func:`score_on_set`, so the
attacks table and the defense tables cannot drift apart (issue 28, "one grid").

Issue 28 finding 3: the best attacker used to be picked on a few common prefix
tokens while its score on its own, wider token set was reported, so 8 of the
42 full-grid rows printed a figure below another attacker of the same cell.
Here every attacker is scored on exactly the cell's set, the cell's recovery
is the maximum top-1 over its attackers (:func:`strongest`), and each other
attacker's gap to it is a paired bootstrap over documents
(:func:`attacks.evaluate.paired_gap`, DESIGN.md section 5).
"""

from __future__ import annotations

from typing import Any

from attacks.base import Inversion
from attacks.evaluate import collect, doc_top1_counts, paired_gap
from attacks.metrics.baselines import TokenPrior
from attacks.predictions import Predictions
from attacks.tapdata import Taps

__all__ = ["score_on_set", "strongest", "gaps_to_strongest", "with_undefended_gaps", "summarise_row"]


def score_on_set(inv: Inversion, target: Taps, *, vocab: int, prior: TokenPrior, n_boot: int, seed: int,
                 meta: dict[str, Any]) -> tuple[dict[str, Any], Predictions]:
    """(``{"metrics", "doc_top1", "test_tokens"}``, per-token predictions) of ``inv`` on the whole of ``target``."""
    pred = collect(inv, target, vocab_size=vocab, prior=prior, n_boot=n_boot, seed=seed, meta=meta)
    return {"metrics": pred.summarize(), "doc_top1": doc_top1_counts(pred), "test_tokens": target.n_tokens}, pred


def strongest(tried: list[dict[str, Any]]) -> dict[str, Any]:
    """The attacker of a cell with the highest user-text top-1 on the cell's set (ties: the first listed).

    Attackers holding deployment pairs (``k``, the ``paired`` threat model) are a different threat model and
    are left out."""
    pool = [x for x in tried if "k" not in x]
    return max(pool, key=lambda x: x["metrics"]["token_acc_top1"]["value"])


def gaps_to_strongest(tried: list[dict[str, Any]], best: dict[str, Any], n_boot: int = 1000,
                      seed: int = 0) -> None:
    """Give every attacker of a cell ``gap_to_best``: the strongest's top-1 minus its own (paired, over documents)."""
    for x in tried:
        x["gap_to_best"] = None if x is best else paired_gap(best, x, n_boot, seed)


def with_undefended_gaps(rows: list[dict[str, Any]], n_boot: int = 1000, seed: int = 0) -> list[dict[str, Any]]:
    """Copies of defense rows with ``vs_undefended``: the row's recovery minus the undefended row's at the same
    head depth, a paired bootstrap over their shared documents (None without an undefended row). Computed from
    the rows' per-document counts, so a merge of shards gives what one run gives."""
    none = {r["depth"]: r["best"] for r in rows if r.get("family") == "none"}
    return [{**r, "vs_undefended": paired_gap(r["best"], none[r["depth"]], n_boot, seed)
             if r["depth"] in none else None} for r in rows]


def summarise_row(row: dict) -> dict:
    """A grid row for the report: attacker metrics cut to top-1 (user text), template top-1, baselines and lift."""
    def short(x: dict) -> dict:
        m = x["metrics"]
        keep = {k: m[k] for k in ("template_token_acc_top1", "lift_token_acc_top1", "baseline_uniform_top1",
                                  "baseline_unigram_top1", "baseline_position_top1") if k in m}
        return {"attack": x["attack"], "threat_model": x["threat_model"], "top1": m["token_acc_top1"], **keep,
                **{k: x[k] for k in ("k", "pairs_used", "kept_public", "gap_to_best", "doc_top1", "seconds",
                                     "seconds_per_token", "test_tokens", "fitted_on_sessions", "candidate_cap")
                   if k in x},
                **{k: v for k, v in x.items() if k.startswith("adapter_")}}

    return {**{k: v for k, v in row.items() if k not in ("attackers", "best")},
            "attackers": [short(x) for x in row["attackers"]], "best": short(row["best"])}
