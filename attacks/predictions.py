"""Per-sample predictions: what an attack guessed for every scored token, on disk, and metrics recomputed from it.

Every attack-scoring command and stage writes a :class:`Predictions` record
beside its results as gzipped JSON lines (issue 14 item 11, the per-sample
output lm-evaluation-harness users asked for): a header line (format,
settings, training prior, metadata, whether every document fits), then one
line per document with ``doc_id``, ``genre``, and per token ``true``,
``topk`` (ranked guesses), ``positions``, ``template`` (1 for chat-template
tokens), plus ``offsets`` and ``pii_spans`` where PII is scored.
:func:`rescore` (``splitinfer attack rescore PATH``) recomputes every metric
from the file alone, with :func:`attacks.metrics.summarize`, the function the
run itself used.

Size cap: a file written under a ``reports`` directory keeps at most
:data:`REPORTS_MAX_BYTES` (compressed); documents past the cap are left out
and the header says so (``complete: false``, ``n_documents_total``), so
rescoring then covers the documents kept. Elsewhere there is no cap.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import tempfile
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attacks.errors import AttackError
from attacks.metrics import summarize
from attacks.metrics.baselines import TokenPrior, prior_from_json, prior_to_json

log = logging.getLogger(__name__)

FORMAT = "splitinfer-predictions"
VERSION = 1
REPORTS_MAX_BYTES = 1 << 20  # 1 MiB per file under reports/

__all__ = ["Predictions", "REPORTS_MAX_BYTES", "predictions_path", "read_predictions", "rescore", "rescore_dir",
           "write_predictions", "write_all"]


@dataclass
class Predictions:
    """Per-document arrays of one scored inversion (see the module docstring), and its scoring settings."""

    doc_ids: list[str]
    genres: list[str]
    true: list[np.ndarray]  # per doc (T,) int64
    topk: list[np.ndarray]  # per doc (T, K) int64
    positions: list[np.ndarray]  # per doc (T,) position in the sequence
    template: list[np.ndarray]  # per doc (T,) bool, True for chat-template tokens
    offsets: list[np.ndarray] | None  # per doc (T, 2) when PII is scored
    spans: list[list[dict[str, Any]]] | None  # per doc PII spans when PII is scored
    prior: TokenPrior | None
    settings: dict[str, Any]  # ks, vocab_size, n_boot, seed
    meta: dict[str, Any] = field(default_factory=dict)
    complete: bool = True
    n_documents_total: int | None = None

    def summarize(self) -> dict[str, dict[str, Any]]:
        """Every metric of :func:`attacks.metrics.summarize` on these predictions."""
        s = self.settings
        return summarize(self.true, self.topk, ks=s["ks"], offsets=self.offsets, spans=self.spans,
                         vocab_size=s.get("vocab_size"), prior=self.prior, positions=self.positions,
                         template_mask=self.template, n_boot=s["n_boot"], seed=s["seed"])

    def _doc_line(self, i: int) -> str:
        rec: dict[str, Any] = {"doc_id": self.doc_ids[i], "genre": self.genres[i], "true": self.true[i].tolist(),
                               "topk": np.asarray(self.topk[i]).tolist(), "positions": self.positions[i].tolist(),
                               "template": self.template[i].astype(int).tolist()}
        if self.offsets is not None:
            rec["offsets"] = np.asarray(self.offsets[i]).tolist()
            rec["pii_spans"] = self.spans[i] if self.spans is not None else []
        return json.dumps(rec, separators=(",", ":"))

    def _header(self, n_kept: int) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, "settings": self.settings,
                           "prior": None if self.prior is None else prior_to_json(self.prior),
                           "meta": self.meta, "complete": n_kept == len(self.doc_ids),
                           "n_documents": n_kept, "n_documents_total": len(self.doc_ids)},
                          separators=(",", ":"), default=str)


def _cap_for(path: Path) -> int | None:
    return REPORTS_MAX_BYTES if "reports" in path.resolve().parts else None


def write_predictions(path: str | os.PathLike[str], pred: Predictions, max_bytes: int | None | str = "auto") -> Path:
    """Write ``pred`` as gzipped JSON lines, atomically; ``max_bytes="auto"`` caps files under ``reports/``."""
    path = Path(path)
    cap = _cap_for(path) if max_bytes == "auto" else max_bytes
    lines = [pred._doc_line(i) for i in range(len(pred.doc_ids))]
    n_kept = len(lines)
    if cap is not None:
        z, size = zlib.compressobj(6, zlib.DEFLATED, 31), 0
        for i, line in enumerate(lines):
            size += len(z.compress((line + "\n").encode()))
            if size + len(z.copy().flush()) > cap:
                n_kept = i
                log.warning("predictions %s: %d of %d documents fit the %d-byte cap for reports/", path, i,
                            len(lines), cap)
                break
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".jsonl.gz", dir=path.parent)
    os.close(fd)
    try:
        with gzip.open(tmp, "wt", encoding="utf-8") as f:
            f.write(pred._header(n_kept) + "\n")
            for line in lines[:n_kept]:
                f.write(line + "\n")
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def read_predictions(path: str | os.PathLike[str]) -> Predictions:
    """Read a file written by :func:`write_predictions`."""
    path = Path(path)
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            header = json.loads(f.readline())
            docs = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        raise AttackError(f"predictions file {str(path)!r} does not exist; check the path") from None
    except (OSError, EOFError, json.JSONDecodeError) as exc:
        raise AttackError(f"{str(path)!r} is not a gzipped predictions file ({exc}); pass a *.jsonl.gz that an "
                          "attack run wrote") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise AttackError(f"{str(path)!r} is not a splitinfer predictions file (its first line has no "
                          f"format={FORMAT!r}); pass a file an attack run wrote")
    if header.get("version") != VERSION:
        raise AttackError(f"{str(path)!r} has predictions format version {header.get('version')}, this code reads "
                          f"{VERSION}; rescore it with the splitinfer version that wrote it")
    if not docs:
        raise AttackError(f"{str(path)!r} holds no documents (the size cap left none); rerun with a larger cap")
    if not isinstance(header.get("settings"), dict) or "ks" not in header["settings"]:
        raise AttackError(f"{str(path)!r}: its header has no settings.ks (the top-k cut-offs it was scored at); the "
                          "file is damaged: rerun the attack that wrote it")
    try:
        pii = "offsets" in docs[0]
        pred = Predictions(
            doc_ids=[d["doc_id"] for d in docs], genres=[d.get("genre", "") for d in docs],
            true=[np.asarray(d["true"], dtype=np.int64) for d in docs],
            topk=[np.asarray(d["topk"], dtype=np.int64).reshape(len(d["true"]), -1) for d in docs],
            positions=[np.asarray(d["positions"], dtype=np.int64) for d in docs],
            template=[np.asarray(d["template"], dtype=bool) for d in docs],
            offsets=[np.asarray(d["offsets"], dtype=np.int64).reshape(-1, 2) for d in docs] if pii else None,
            spans=[d["pii_spans"] for d in docs] if pii else None,
            prior=None if header.get("prior") is None else prior_from_json(header["prior"]),
            settings=header["settings"], meta=header.get("meta") or {}, complete=bool(header.get("complete")),
            n_documents_total=header.get("n_documents_total"))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise AttackError(f"{str(path)!r}: a document line is malformed ({type(exc).__name__}: {exc}); the file is "
                          "damaged: rerun the attack that wrote it") from None
    repeated = sorted((d for d, n in Counter(pred.doc_ids).items() if n > 1), key=str)
    if repeated:
        raise AttackError(f"{str(path)!r}: document {repeated[0]!r} occurs twice, which would count its tokens "
                          "twice; the file is damaged: rerun the attack that wrote it")
    return pred


def rescore(path: str | os.PathLike[str]) -> tuple[dict[str, dict[str, Any]], Predictions]:
    """Every metric recomputed from a predictions file, and the record it came from."""
    pred = read_predictions(path)
    if not pred.complete:
        log.warning("%s holds %d of %d documents (size cap): the metrics cover those only", path,
                    len(pred.doc_ids), pred.n_documents_total)
    return pred.summarize(), pred


def predictions_path(out_dir: str | os.PathLike[str], run: str) -> Path:
    """Where the predictions of results run ``run`` go: ``out_dir/predictions/<run with / as __>.jsonl.gz``."""
    return Path(out_dir) / "predictions" / (run.replace("/", "__").replace(":", "-") + ".jsonl.gz")


def write_all(records: dict[str, Predictions], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write ``{run: record}`` to :func:`predictions_path` (the run name goes into the header); returns the paths."""
    out = []
    for run, rec in records.items():
        rec.meta.setdefault("run", run)
        out.append(write_predictions(predictions_path(out_dir, run), rec))
    return out


def _results_file(directory: Path) -> Path:
    main = directory / "results.json"
    if main.is_file():  # never fall back to another document beside a damaged results.json
        try:
            doc = json.loads(main.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise AttackError(f"{str(main)!r} is not valid JSON ({exc}); the file is damaged: restore it") from None
        if not (isinstance(doc, dict) and isinstance(doc.get("results"), dict)):
            raise AttackError(f"{str(main)!r} has no 'results' table; pass the output directory of a suite run or "
                              "of `bench attacks`")
        return main
    for path in sorted(directory.glob("*.json")):
        if path.is_file():
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except ValueError:
                continue
            if isinstance(doc, dict) and isinstance(doc.get("results"), dict):
                return path
    raise AttackError(f"{str(directory)!r} holds no results JSON (results.json or *.json with a 'results' table); "
                      "pass the output directory of a suite run or of `bench attacks`")


def _recorded(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """run -> every metric a results document holds: its ``results`` table, completed by the pooled rows of the
    suite's attack stage (``data.attacks.rows``, which keep the metrics the table leaves out)."""
    out = {run: dict(m) for run, m in doc["results"].items() if isinstance(m, dict)}
    stage = (doc.get("data") or {}).get("attacks")
    for r in stage.get("rows", []) if isinstance(stage, dict) else []:
        if r.get("corpus") == "all" and isinstance(r.get("metrics"), dict):
            have = out.setdefault(f"attacks/{r['attack']}/{r['boundary']}", {})
            for name, m in r["metrics"].items():
                have.setdefault(name, m)
    return out


def rescore_dir(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Recompute the metrics of every predictions file under ``directory/predictions`` and compare them with the
    results document beside it (value, interval and n of every metric the predictions define).

    Returns one record per file: ``run``, ``metrics`` (compared), ``mismatches`` (names), ``complete`` (a file cut
    by the size cap is rescored but not compared) and ``missing`` (a run the results document lacks).
    """
    directory = Path(directory)
    results = _recorded(json.loads(_results_file(directory).read_text(encoding="utf-8")))
    files = sorted((directory / "predictions").glob("*.jsonl.gz"))
    if not files:
        raise AttackError(f"{str(directory / 'predictions')!r} holds no *.jsonl.gz predictions; the run wrote none")
    out = []
    for path in files:
        summary, pred = rescore(path)
        run = pred.meta.get("run") or f"attacks/{pred.meta.get('attack')}/{pred.meta.get('boundary')}"
        have = results.get(run)
        rec: dict[str, Any] = {"run": run, "file": path.name, "complete": pred.complete, "missing": have is None,
                               "metrics": 0, "mismatches": []}
        if have is not None and pred.complete:
            for name, m in summary.items():
                rec["metrics"] += 1
                got = have.get(name)
                if got is None or any(got.get(k) != m.get(k) for k in ("value", "ci_low", "ci_high", "n")):
                    rec["mismatches"].append(name)
        out.append(rec)
    return out
