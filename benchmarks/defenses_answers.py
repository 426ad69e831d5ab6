"""Plain answers to the defense questions (a)-(e), (f) for the permute stretch and (g) the "empty middle", from the
``defenses`` stage.

Each answer is computed from whatever the run measured; a question whose rows
the suite's grid lacks is answered ``not measured in this suite``. Recovery is
the best attacker's user-text top-1 with its 95% interval (bootstrap over
documents; ``n/a`` below 2 documents); utility is next-token agreement against
the undefended model. Depth identification (b) is a yes when depth-id names more sessions than halfway
from chance to all of them and its 95% Clopper-Pearson lower bound over sessions lies above chance.
"""

from __future__ import annotations

from attacks.metrics.intervals import clopper_pearson
from benchmarks.defenses_speed import measured_tok_s

NOT_MEASURED = "not measured in this suite"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _rec(r: dict) -> str:
    b = r["best"]["top1"]
    ci = "" if b.get("ci_low") is None else f" [{100 * b['ci_low']:.1f}, {100 * b['ci_high']:.1f}]"
    return f"{_pct(b['value'])}{ci} ({r['best']['attack']}, {r['best']['threat_model']})"


def _none(rows: list[dict], depth: int) -> dict | None:
    return next((r for r in rows if r["depth"] == depth and r["family"] == "none"), None)


def _versus_none(rows: list[dict], family: str) -> list[str]:
    out = []
    for r in (r for r in rows if r["family"] == family):
        base = _none(rows, r["depth"])
        ref = f" against {_rec(base)} undefended" if base else ""
        out.append(f"head {r['depth']}, `{r['defense']}`: {_rec(r)}{ref}; next-token agreement "
                   f"{_pct(r['next_token_agreement'])}")
    return out


def _paired(rows: list[dict], family: str) -> list[tuple[dict, dict]]:
    """(row, the undefended row at its depth) for each of the family's rows that has one."""
    pairs = [(r, _none(rows, r["depth"])) for r in rows if r["family"] == family]
    return [(r, base) for r, base in pairs if base is not None]


def _below(r: dict, base: dict) -> bool:
    """The defended row recovers less than the undefended one: the paired bootstrap interval of the difference
    over the same documents (``vs_undefended``, issue 28) lies below 0; for rows without it (older results),
    the defended row's 95% interval lies wholly below the undefended row's."""
    gap = r.get("vs_undefended")
    if gap is not None and gap.get("ci_high") is not None:
        return gap["ci_high"] < 0
    a, b = r["best"]["top1"], base["best"]["top1"]
    return a.get("ci_high") is not None and b.get("ci_low") is not None and a["ci_high"] < b["ci_low"]


def _lower(rows: list[dict], family: str) -> str:
    """``yes``/``no`` (and how much) for a family, from its rows against the undefended row at the same depth.

    A drop of 5 points or more is a ``yes`` only where it is significant (:func:`_below`: the paired difference's
    interval excludes 0); otherwise this sample cannot tell it from no drop (e.g. 87.5% [75, 100] of 16 tokens
    against 100%), and the answer says so.
    """
    pairs = _paired(rows, family)
    if not pairs:
        return ""
    drops = [(base["best"]["top1"]["value"] - r["best"]["top1"]["value"], _below(r, base)) for r, base in pairs]
    worst = max(d for d, _ in drops)
    if worst < 0.05:
        return f"no: recovery falls by at most {100 * worst:.1f} points. "
    clear = [d for d, sep in drops if sep and d >= 0.05]
    if clear:
        return f"yes, partly: recovery falls by up to {100 * max(clear):.1f} points (significant at 95%). "
    return (f"not shown: recovery falls by up to {100 * worst:.1f} points, inside the 95% intervals of this "
            "sample. ")


def _interval(r: dict, key: str) -> tuple[float, float | None, float | None]:
    """(value, low, high) of a utility metric: the row's bootstrap interval where it has one, else the point."""
    got = r.get("intervals", {}).get(key)
    if got:
        return got["value"], got.get("ci_low"), got.get("ci_high")
    return r[key], None, None


def _cost(r: dict) -> str:
    """Recovery, agreement, speed and bytes of one row, each with what the row has."""
    agr, lo, hi = _interval(r, "next_token_agreement")
    ci = "" if lo is None else f" [{100 * lo:.1f}, {100 * hi:.1f}]"
    tok_s = measured_tok_s(r.get("modelled_tok_s_80ms"))
    if "modelled_tok_s_80ms" not in r:
        speed = ""
    elif tok_s is None:  # no decode step timed: no speed, never "0.00 tok/s"
        speed = ", no tok/s at 80 ms (every `combined` generation stopped at its first token)"
    else:
        speed = f", {tok_s:.2f} tok/s at 80 ms (modelled)"
    size = "" if r.get("bytes_per_step") is None else f", {r['bytes_per_step']:,.0f} bytes/step"
    return f"head {r['depth']}, `{r['defense']}`: recovery {_rec(r)}, next-token agreement {_pct(agr)}{ci}{speed}{size}"


EMPTY_RECOVERY, EMPTY_AGREEMENT = 0.10, 0.90


def _recovery(r: dict) -> tuple[float, float]:
    """(point, 95% upper bound) of the strongest attacker's recovery; the point where there is no interval."""
    t = r["best"]["top1"]
    return t["value"], t["value"] if t.get("ci_high") is None else t["ci_high"]


def _agreement(r: dict) -> tuple[float, float]:
    """(point, 95% lower bound) of next-token agreement; the point where there is no interval."""
    value, lo, _ = _interval(r, "next_token_agreement")
    return value, value if lo is None else lo


def _middle(r: dict) -> str | None:
    """``sure`` when both intervals lie on the right side of their line (recovery under 10%, agreement above 90%),
    ``points`` when only the points do, else None."""
    (rec, rec_high), (agr, agr_low) = _recovery(r), _agreement(r)
    if rec_high < EMPTY_RECOVERY and agr_low > EMPTY_AGREEMENT:
        return "sure"
    return "points" if rec < EMPTY_RECOVERY and agr > EMPTY_AGREEMENT else None


def answer_a(rows: list[dict]) -> str:
    got = _versus_none(rows, "lora-random")
    if not got:
        return NOT_MEASURED
    return _lower(rows, "lora-random") + "; ".join(got) + "."


def _session_interval(r: dict) -> tuple[float, float]:
    """95% Clopper-Pearson bounds of depth-id's session accuracy (sessions as the units)."""
    return clopper_pearson(round(r["sequence_acc"] * r["sequences"]), r["sequences"])


def _identifies(r: dict) -> bool:
    """More than halfway from chance to certainty, and the interval's lower bound above chance."""
    return r["sequence_acc"] > (1 + r["chance"]) / 2 and _session_interval(r)[0] > r["chance"]


def answer_b(random_split: list[dict]) -> str:
    if not random_split:
        return NOT_MEASURED
    return "; ".join(
        f"`{r['defense']}` ({r['threat_model']}): " + ("yes" if _identifies(r) else "not reliably")
        + f", depth-id names the session's depth for {_pct(r['sequence_acc'])} of {r['sequences']} sessions "
        f"(95% CI [{100 * _session_interval(r)[0]:.1f}, {100 * _session_interval(r)[1]:.1f}]; chance "
        f"{_pct(r['chance'])}; {_pct(r['token_acc'])} of single states)" + _end_to_end(r)
        for r in random_split) + "."


def _end_to_end(r: dict) -> str:
    if "end_to_end_top1" not in r:
        return ""
    return (f"; then the probe of the depth it names recovers {_pct(r['end_to_end_top1']['value'])} of user-text "
            f"tokens ({_pct(r['known_depth_top1']['value'])} told the true depth)")


def scan_cap(best: dict, options: dict | None) -> int | None:
    """The candidate cap of the scan behind a row's strongest attacker, None for an uncapped scan or no matcher.

    Rows record it (``candidate_cap``); rows of older runs do not, and their matchers applied a configured
    integer ``max_candidates`` in every cell, so that is read from the run's attacker options instead."""
    if "candidate_cap" in best:
        return best["candidate_cap"]
    cap = (options or {}).get(best["attack"], {}).get("max_candidates")
    return cap if isinstance(cap, int) else None


def _capped_drops(rows: list[dict], family: str, options: dict | None) -> str:
    """A sentence on the family's rows that recover less than the undefended row while their strongest attacker
    scanned a capped candidate list: where a match can be exact (quantisation), such a miss may be the cap's."""
    hit = [(r, scan_cap(r["best"], options)) for r, base in _paired(rows, family)
           if r["best"]["top1"]["value"] < base["best"]["top1"]["value"]]
    hit = [(r, cap) for r, cap in hit if cap is not None]
    if not hit:
        return ""
    where = ", ".join(f"head {r['depth']} `{r['defense']}` (at most {cap} per position)" for r, cap in hit)
    return (f" The matcher behind {where} scored only the proposer's first candidates, where a state can be "
            "matched exactly: a capped scan misses what a whole-vocabulary one finds, so that drop is a bound set "
            "by the attacker, not shown to be the format's (runs of the current code lift the cap wherever a match "
            "can be exact).")


def answer_c(rows: list[dict], options: dict | None = None) -> str:
    got = _versus_none(rows, "quant")
    if not got:
        return NOT_MEASURED
    formats = {r["strength"].get("quant", {}).get("format") for r in rows if r["family"] == "quant"}
    missing = [f for f in ("int8", "int4", "fp8") if f not in formats]
    return _lower(rows, "quant") + "; ".join(got) + "." + _capped_drops(rows, "quant", options) + (
        f" {', '.join(missing)}: {NOT_MEASURED}." if missing else "")


def answer_d(rows: list[dict]) -> str:
    noise = [r for r in rows if r["family"] == "noise"]
    if not noise:
        return NOT_MEASURED
    good = [r for r in noise if _middle(r) == "sure"]
    close = [r for r in noise if _middle(r) == "points"]
    if good:
        head = "yes: " + ", ".join(f"head {r['depth']} `{r['defense']}`" for r in good)
    elif close:
        head = ("not shown: the points of " + ", ".join(f"head {r['depth']} `{r['defense']}`" for r in close)
                + " are in, but an interval crosses its line")
    else:
        head = ("no level measured here: every noise level either leaves the best adaptive attacker at or above 10% "
                "or costs next-token agreement below 90%")
    return head + ". " + "; ".join(_cost(r) for r in noise) + "."


def answer_e(rows: list[dict]) -> str:
    private = [r for r in rows if r["family"] == "lora-private"]
    if not private:
        return NOT_MEASURED
    parts = []
    for r in private:
        vm = [x for x in r["attackers"] if x["attack"].startswith("vocab-match")]
        learned = [x for x in r["attackers"] if not x["attack"].startswith("vocab-match") and x.get("k") is None]
        paired = sorted((x for x in r["attackers"] if x.get("k") is not None), key=lambda x: (x["k"], x["attack"]))
        text = f"head {r['depth']}, `{r['defense']}` (next-token agreement {_pct(r['next_token_agreement'])}): "
        text += ", ".join(f"{x['attack']} ({x['threat_model']}) {_pct(x['top1']['value'])}" for x in vm + learned)
        if paired:
            text += "; paired (known-plaintext pairs from the deployment): " + ", ".join(
                f"{x['attack'].removesuffix('+paired')} k={x['k']} {_pct(x['top1']['value'])}"
                + (" (validation kept the public fit)" if x.get("kept_public") else "") for x in paired)
            above = next((x["k"] for x in paired if x["top1"]["value"] > 0.5), None)
            text += (f"; above 50% from k = {above}" if above is not None else
                     f"; not above 50% up to k = {paired[-1]['k']}")
        parts.append(text)
    stops = all(x["top1"]["value"] < 0.5 for r in private for x in r["attackers"]
                if x["attack"].startswith("vocab-match"))
    return ("White-box vocabulary matching with the public weights " + ("is stopped (below 50%)" if stops else
            "is not stopped") + ". " + "; ".join(parts) + ".")


def answer_f(rows: list[dict]) -> str:
    permuted = [r for r in rows if r["family"] == "permute"]
    if not permuted:
        return NOT_MEASURED
    parts = [f"head {r['depth']}, `{r['defense']}` (next-token agreement {_pct(r['next_token_agreement'])}, greedy "
             f"identity {_pct(r['greedy_identity'])}): " + ", ".join(
                 f"{x['attack']} ({x['threat_model']}) {_pct(x['top1']['value'])}" for x in r["attackers"])
             for r in permuted]
    broken = all(r["best"]["top1"]["value"] >= 0.9 for r in permuted)
    return ("No: the cloud solves for the secret basis from the transformed weights it is handed (orthogonal "
            "Procrustes against the public weights) and then matches as if undefended" if broken else
            "Not fully: the best attacker stays below 90% somewhere") + ". " + "; ".join(parts) + "."


def answer_g(rows: list[dict]) -> str:
    """The "empty middle" question (arXiv 2605.24042) over every defended configuration, per head depth.

    A configuration is in the middle when the strongest attacker's recovery is under 10% and next-token agreement
    above 90%. ``yes`` needs both 95% intervals on the right side of their line (recovery's upper bound under 10%,
    agreement's lower bound over 90%); a row whose points are in but whose intervals cross a line is ``not shown``.
    Where no row is in, the closest ones are named with their cost: the lowest recovery among rows that keep
    agreement above 90%, and the highest agreement among rows that hold recovery under 10%.
    """
    defended = [r for r in rows if r["family"] != "none"]
    if not defended:
        return NOT_MEASURED
    parts = []
    for depth in sorted({r["depth"] for r in defended}):
        at = [r for r in defended if r["depth"] == depth]

        sure = [r for r in at if _middle(r) == "sure"]
        points = [r for r in at if _middle(r) == "points"]
        if sure:
            parts.append(f"head {depth}: yes, " + "; ".join(_cost(r) for r in sure))
            continue
        if points:
            parts.append(f"head {depth}: not shown (the points are in, an interval crosses its line): "
                         + "; ".join(_cost(r) for r in points))
            continue
        text = f"head {depth}: no ({len(at)} configuration{'' if len(at) == 1 else 's'})"
        usable = [r for r in at if _agreement(r)[0] > EMPTY_AGREEMENT]
        hiding = [r for r in at if _recovery(r)[0] < EMPTY_RECOVERY]
        if usable:
            text += "; least recovered with agreement above 90%: " + _cost(min(usable, key=lambda r: _recovery(r)[0]))
        else:
            text += "; no configuration keeps agreement above 90%"
        if hiding:
            text += "; best agreement with recovery under 10%: " + _cost(max(hiding, key=lambda r: _agreement(r)[0]))
        else:
            text += "; no configuration holds recovery under 10%"
        parts.append(text)
    return "; ".join(parts) + "."


def answers_section(data: dict) -> list[str]:
    """The report's answers to (a)-(g), one line each."""
    rows = data.get("rows", [])
    return ["### Answers to the seed paper's defense questions", "",
            f"- (a) Does a random LoRA perturbation lower recovery by an adaptive attacker? {answer_a(rows)}",
            f"- (b) Can someone who sees only the states identify the split depth under random splits? "
            f"{answer_b(data.get('random_split', []))}",
            f"- (c) How much do int8 / int4 / fp8 lower leakage? {answer_c(rows, data.get('attacker_options'))}",
            f"- (d) Is there a noise level where the best adaptive attacker recovers under 10% while next-token "
            f"agreement stays above 90%? {answer_d(rows)}",
            f"- (e) Does private fine-tuning of the local layers stop white-box vocabulary matching, and how many "
            f"known-plaintext pairs does a learned attacker need to get back above 50%? {answer_e(rows)}",
            f"- (f) Does a secret permutation or rotation of the hidden dimension (PermLLM / STIP family) hide the "
            f"states from the cloud that runs the transformed body? {answer_f(rows)}",
            f"- (g) Is any configuration in the \"empty middle\" (arXiv 2605.24042): recovery by the strongest "
            f"adaptive attacker under 10% with next-token agreement above 90%, both 95% intervals on the right side "
            f"of their line, on this model? {answer_g(rows)}", ""]
