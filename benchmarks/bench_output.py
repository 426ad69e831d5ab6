"""One output format for the single benchmarks (``bench speed | exactness | transport | decoding | extract``).

Each command's figures become a versioned results document (:mod:`benchmarks.schema`),
the same format ``bench run`` writes, so ``splitinfer bench regress`` reads any of them:
the headline figures as metrics (``results[run][metric]``), the command's settings under
``config`` and its full raw output under ``data`` (an extra top-level key, which the
schema allows). The suite name is ``bench-<command>``.

Kinds follow the schema's rules: token identity and greedy tau are ``exact``; measured /
bound throughput ratios are ``efficiency``; timings that depend on the machine are ``info``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.schema import add_metric, metric, new_results, save
from splitinfer.atomic import write_text


def _scalars(raw: dict) -> dict[str, Any]:
    """The settings of a raw result: its top-level scalars (JSON-safe config)."""
    return {k: v for k, v in raw.items() if v is None or isinstance(v, (str, int, float, bool))}


def document(command: str, config: dict, data: Any) -> dict:
    """An empty results document of ``bench COMMAND`` holding ``data`` (the raw output)."""
    doc = new_results(config, f"bench-{command}")
    doc["data"] = data
    return doc


def _add_rows(doc: dict, rows: list[dict], run: Callable[[dict], str], specs: tuple) -> dict:
    """One run per row (named by ``run(row)``); ``specs``: (metric name, row key, metric keyword arguments)."""
    for r in rows:
        for name, key, kwargs in specs:
            add_metric(doc, run(r), name, metric(r[key], **kwargs))
    return doc


TOK_S = {"kind": "info", "unit": "tok/s"}
BYTES = {"higher_is_better": False, "kind": "exact", "unit": "B"}


def speed_document(raw: dict) -> dict:
    doc = _add_rows(document("speed", _scalars(raw), raw), raw["rows"],
                    lambda r: f"speed/split={raw['split']}/rtt={r['rtt_ms']:g}",
                    (("tok_s", "measured_tok_s", TOK_S), ("bytes_per_step", "bytes_per_step", BYTES)))
    for r in raw["rows"]:  # efficiency with its measured spread (regress's tolerance when wider than the default)
        add_metric(doc, f"speed/split={raw['split']}/rtt={r['rtt_ms']:g}", "efficiency",
                   metric(r["efficiency"], r.get("efficiency_low"), r.get("efficiency_high"), kind="efficiency"))
    return doc


def exactness_document(rows: list[dict], config: dict) -> dict:
    doc = document("exactness", config, rows)
    for split in dict.fromkeys(r["split"] for r in rows):
        for wire in dict.fromkeys(r["wire"] for r in rows):
            rs = [r for r in rows if r["split"] == split and r["wire"] == wire]
            if not rs:
                continue
            run = f"exactness/split={split}/wire={wire}"
            add_metric(doc, run, "identical_share", metric(sum(r["identical"] for r in rs) / len(rs), n=len(rs),
                                                           kind="exact"))
            add_metric(doc, run, "max_logit_diff", metric(max(r["max_logit_diff"] for r in rs), n=len(rs),
                                                          higher_is_better=False, kind="info"))
    return doc


def transport_document(raw: dict) -> dict:
    doc = _add_rows(document("transport", _scalars(raw), raw), raw["overhead"],
                    lambda r: f"transport/body={r['model']}",
                    (("transport_ms", "transport_ms", {"higher_is_better": False, "kind": "info", "unit": "ms"}),
                     ("bytes_per_step", "bytes_per_step", BYTES)))
    return _add_rows(doc, raw["concurrency"], lambda r: f"transport/sessions={r['sessions']}",
                     (("aggregate_tok_s", "aggregate_tok_s", TOK_S),
                      ("identical_outputs", "identical_outputs", {"kind": "exact"})))


def extract_document(raw: dict) -> dict:
    return _add_rows(document("extract", _scalars(raw), raw), raw["rows"],
                     lambda r: f"extract/boundary={r['boundary']}",
                     (("extract_tok_s", "extract_tok_s", TOK_S), ("ratio", "ratio", {"kind": "efficiency"})))


def decoding_document(summary: dict) -> dict:
    """From ``bench decoding``'s summary (config + per-label table + targets)."""
    config = summary.get("config", {})
    doc = document("decoding", config if isinstance(config, dict) else {}, summary)
    for label, row in summary["table"].items():
        run = f"decoding/{label}"
        add_metric(doc, run, "identical_share", metric(row["identical"] / row["n"], n=row["n"], kind="exact"))
        add_metric(doc, run, "tau_mean", metric(row["tau"]["mean"], n=row["n"], kind="info", unit="tokens/step"))
        add_metric(doc, run, "max_logit_diff", metric(row["max_logit_diff"], n=row["n"], higher_is_better=False,
                                                      kind="info"))
    return doc


def write(doc: dict, out: str | Path) -> Path:
    """Validate and write ``doc`` atomically; print where."""
    path = save(doc, out)
    print(f"results written to {path}")
    return path


def write_dir(out: str | Path, text: str, doc: dict) -> int:
    """A report directory: ``report.md`` (``text``) and ``results.json`` (``doc``), each written atomically; the
    report printed. Exit status 0."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "report.md", text)
    write(doc, out / "results.json")
    print(text)
    return 0


def emit(table: str, make_document: Callable[[], dict], out: str | Path | None) -> int:
    """Print a single benchmark's table; with ``out``, build its results document and write it. Exit status 0."""
    print(table)
    if out:
        write(make_document(), out)
    return 0
