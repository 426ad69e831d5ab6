"""``splitinfer bench compare``: does a conclusion on one model hold on another (e.g. SmolLM2-135M vs Gemma 3 270M)?

Reads two or more results documents (``bench run``'s results.json) and writes one Markdown page: the attack rows
(``attacks/<attack>/<head|tail>:<d>``: user-text top-1 beside the unigram-prior baseline) and the defense rows
(``defenses/head:<d>/<spec>``: the strongest attacker's ``recovery_top1`` and ``next_token_agreement``) present in
every document, one column group per document, each figure with the interval and n its document records.
Defense specs carry numbers calibrated on each model's own states (``clip=`` of noise, the ``profile=`` key of
pclip / shaped-noise / denoise), so rows are matched by the spec without them (:func:`match_spec`); each
document's calibrated values are shown in the row. Rows in only some documents are listed by name below the
tables, never dropped. Threat-model labels are the ones each document recorded (its ``data`` rows, as the suite
report shows them); an attack row without one is labelled by :func:`benchmarks.attack_grid.row_threat_model`
(the attacks stage's victim runs the published weights).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from benchmarks.schema import load, results_path
from splitinfer import atomic
from splitinfer.errors import SplitInferError

__all__ = ["CALIBRATED", "attack_rows", "compare_documents", "defense_rows", "figure", "match_spec",
           "write_comparison"]

ATTACK_RUN = re.compile(r"^attacks/(?P<attack>.+)/(?P<side>head|tail):(?P<depth>\d+)$")
DEFENSE_RUN = re.compile(r"^defenses/head:(?P<depth>\d+)/(?P<spec>.+)$")
CALIBRATED = ("clip", "profile")  # spec parameters fitted on the model's own states: differ between models
_CALIBRATED = re.compile(r"(?<=[(,])(" + "|".join(CALIBRATED) + r")=[^,()]*,?")
NOT_RECORDED = "not recorded"


def match_spec(spec: str) -> tuple[str, list[str]]:
    """(the spec without its calibrated parameters, the removed ``name=value`` parts in order).

    ``noise(sigma=0.05,clip=67.31)`` -> (``noise(sigma=0.05)``, [``clip=67.31``]); ``none`` is unchanged."""
    removed = [m.group(0).rstrip(",") for m in _CALIBRATED.finditer(spec)]
    key = _CALIBRATED.sub("", spec).replace(",)", ")").replace("()", "")
    return key, removed


def figure(m: dict[str, Any] | None) -> str:
    """``87.5% [81.2, 93.1] (n=320)``; ``[n/a]`` without a recorded interval; ``-`` when absent."""
    if m is None:
        return "-"
    v = m.get("value")
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "n/a" if v is None else str(v)
    out = f"{100 * v:.1f}%"
    lo, hi = m.get("ci_low"), m.get("ci_high")
    out += " [n/a]" if lo is None or hi is None else f" [{100 * lo:.1f}, {100 * hi:.1f}]"
    return out + ("" if m.get("n") is None else f" (n={m['n']})")


def _data_rows(doc: dict[str, Any], stage: str) -> list[dict[str, Any]]:
    got = doc.get("data", {})
    got = got.get(stage, {}) if isinstance(got, dict) else {}
    rows = got.get("rows", []) if isinstance(got, dict) else []
    return [r for r in rows if isinstance(r, dict)]


def _recipe_label(attack: str) -> str:
    """The label the attacks stage gives ``attack`` against its victim (published weights), or NOT_RECORDED."""
    from attacks.errors import AttackError
    from attacks.registry import get_attack_class
    from benchmarks.attack_grid import ALIASES, Victim, row_threat_model

    try:
        cls = get_attack_class(ALIASES.get(attack, (attack,))[0])
    except AttackError:
        return NOT_RECORDED
    return row_threat_model(cls.threat_model, Victim())


def attack_rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``attacks/<attack>/<side>:<d>`` -> {metrics, threat, sort} for every attack run with ``token_acc_top1``."""
    recorded: dict[tuple[str, str], str] = {}
    for r in _data_rows(doc, "attacks"):
        if r.get("corpus", "all") == "all" and isinstance(r.get("threat_model"), str):
            recorded.setdefault((str(r.get("attack")), str(r.get("boundary"))), r["threat_model"])
    out = {}
    for run, metrics in doc["results"].items():
        m = ATTACK_RUN.match(run)
        if m is None or "token_acc_top1" not in metrics:
            continue
        boundary = f"{m['side']}:{m['depth']}"
        threat = recorded.get((m["attack"], boundary)) or _recipe_label(m["attack"])
        out[run] = {"metrics": metrics, "threat": threat, "sort": (m["attack"], m["side"], int(m["depth"]))}
    return out


def defense_rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``defenses/head:<d>/<spec without calibrated parameters>`` -> {metrics, threat, calibrated, sort}.

    Two specs of one document that differ only in calibrated parameters keep their full specs (they are not
    matched across documents then, and show up as rows not in every document)."""
    best: dict[tuple[int, str], str] = {}
    for r in _data_rows(doc, "defenses"):
        b = r.get("best")
        if isinstance(b, dict) and isinstance(r.get("depth"), int):
            best[(r["depth"], str(r.get("defense")))] = f"{b.get('attack', '?')} ({b.get('threat_model', '?')})"
    found: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for run, metrics in doc["results"].items():
        m = DEFENSE_RUN.match(run)
        if m is None or "recovery_top1" not in metrics:  # attacker sub-rows carry token_acc_top1 only
            continue
        depth, spec = int(m["depth"]), m["spec"]
        key, removed = match_spec(spec)
        row = {"metrics": metrics, "threat": best.get((depth, spec), NOT_RECORDED), "calibrated": ",".join(removed),
               "sort": (depth, key != "none", key)}
        found.setdefault(f"defenses/head:{depth}/{key}", []).append((run, row))
    out = {}
    for key, rows in found.items():
        for run, row in rows if len(rows) > 1 else [(key, rows[0][1])]:
            out[run] = row
    return out


def _label(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else f"D{i + 1}"


def _model(doc: dict[str, Any]) -> str:
    cfg = doc["config"]
    sha = cfg.get("model_sha256")
    return f"{cfg.get('model', '?')} ({str(sha)[:12] if sha else 'sha256 not recorded'})"


def _git(doc: dict[str, Any]) -> str:
    dirty = doc.get("git_dirty")
    state = "dirty" if dirty else "clean" if dirty is False else "dirty state not recorded"
    out = f"git {str(doc.get('git_hash'))[:12]} ({state})"
    if doc.get("git_hashes"):
        out += f"; shards from {', '.join(str(h)[:12] for h in doc['git_hashes'])}"
    return out


def _header(docs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    lines = ["# Cross-model comparison", "", "Documents compared:", ""]
    for i, (path, doc) in enumerate(docs):
        seed = doc["config"].get("seed", "not recorded")
        shards = f", merged from {doc['merged_shards']} shards" if doc.get("merged_shards") else ""
        lines.append(f"- **{_label(i)}**: `{path}`: model {_model(doc)}, suite `{doc['suite']}`, seed {seed}, "
                     f"{_git(doc)}, dated {doc.get('date')}{shards}")
    return lines + [
        "", ("Each figure is `value [ci_low, ci_high] (n=...)` exactly as its own document records it: intervals are "
        "per document (each run's own, over its own test documents) and `[n/a]` where the document records none; "
        "nothing is recomputed or pooled here, and no difference between documents is tested (each model tokenizes "
        "and scores its own token set, so no paired comparison exists). Scope: attack top-1 and defense recovery "
        "are user text (chat-template tokens excluded), as in the suite report; next-token agreement is on the "
        "suite's utility text. Threat models: the label each document recorded "
        "for the row; where documents disagree, each is shown."), ""]


def _threat(labels: list[str], tags: list[str]) -> str:
    if len(set(labels)) == 1:
        return labels[0]
    return "; ".join(f"{t}: {x}" for t, x in zip(tags, labels))


def _table(title: str, cols: list[str], rows_per_doc: list[dict[str, dict[str, Any]]], metrics: list[str],
           tags: list[str], heads: list[str], what: str) -> tuple[list[str], list[str]]:
    """(the Markdown table of the rows every document holds, the rows some documents lack)."""
    shared = set(rows_per_doc[0]).intersection(*rows_per_doc[1:])
    seen = sorted(set().union(*rows_per_doc))
    lines = [f"## {title}", ""]
    if not shared:
        lines += [f"No {what} row is in every document.", ""]
    else:
        head = ["row", "threat model" if what == "attack" else "strongest attacker (threat model)"]
        head += [f"{h}: {c}" for h in heads for c in cols]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for run in sorted(shared, key=lambda r: rows_per_doc[0][r]["sort"]):
            got = [rows[run] for rows in rows_per_doc]
            name = f"`{run}`"
            if any(g.get("calibrated") for g in got):
                name += " (" + "; ".join(f"{t}: {g['calibrated'] or '-'}" for t, g in zip(tags, got)) + ")"
            cells = [figure(g["metrics"].get(k)) for g in got for k in metrics]
            lines.append("| " + " | ".join([name, _threat([g["threat"] for g in got], tags)] + cells) + " |")
        lines.append("")
    missing = [f"- `{r}` (in {', '.join(t for t, rows in zip(tags, rows_per_doc) if r in rows)})"
               for r in seen if r not in shared]
    return lines, missing


def compare_documents(docs: list[tuple[str, dict[str, Any]]]) -> str:
    """The Markdown comparison of ``docs`` ((path, validated results document) pairs, two or more)."""
    if len(docs) < 2:
        raise SplitInferError(f"bench compare needs at least 2 results documents, got {len(docs)}; "
                              "e.g. bench compare reports/quick/results.json reports/gemma/results.json")
    empty = [path for path, d in docs if not attack_rows(d) and not defense_rows(d)]
    if empty:  # else the page would say every row is in every document, of none
        raise SplitInferError(f"{empty[0]} holds no attack or defense rows; bench compare sets suite runs with an "
                              "attacks or defenses stage side by side")
    tags = [_label(i) for i in range(len(docs))]
    heads = [f"{t} {_model(d)}" for t, (_, d) in zip(tags, docs)]
    lines = _header(docs)
    att, att_missing = _table("Attacks (token top-1, user text)", ["top-1", "unigram baseline"],
                              [attack_rows(d) for _, d in docs], ["token_acc_top1", "baseline_unigram_top1"], tags,
                              heads, "attack")
    dfn, dfn_missing = _table("Defenses (strongest attacker's recovery; utility)",
                              ["recovery top-1 (lower is better)", "next-token agreement"],
                              [defense_rows(d) for _, d in docs], ["recovery_top1", "next_token_agreement"], tags,
                              heads, "defense")
    lines += att + dfn + ["## Not in every document", ""]
    missing = att_missing + dfn_missing
    lines += missing if missing else ["Every attack and defense row is in every document."]
    return "\n".join(lines) + "\n"


def write_comparison(paths: list[str | Path], out: str | Path) -> Path:
    """Load the documents at ``paths`` (files or run directories), write the comparison to ``out`` atomically."""
    docs = [(str(results_path(p)), load(results_path(p))) for p in paths]
    return atomic.write_text(Path(out), compare_documents(docs))
