"""The versioned results JSON of the benchmark harness (DESIGN.md §7).

A results document looks like::

    {
      "schema_version": 1,          # the major version (see "Versioning" below)
      "schema_minor": 1,            # the minor version (absent: 0)
      "suite": "quick",
      "config": {...},              # model + sha256, corpus manifests, split, seeds
      "git_hash": "3f2a...",        # or "unknown" outside a git checkout
      "git_dirty": false,           # or null when unknown
      "versions": {"python": "3.11.7", "torch": "2.4.0", ...},  # null when missing; + torch's CPU ISA
      "date": "2025-01-01T12:00:00+00:00",
      "results": {
        "<run>": {"<metric>": {"value": 0.93, "ci_low": 0.91, "ci_high": 0.95,
                               "n": 4096, "higher_is_better": true,
                               "kind": "accuracy"}}
      }
    }

``kind`` says how ``benchmarks.regress`` compares a metric with the baseline:

* ``"exact"``: must match exactly (token identity, greedy tau); value may be a
  number, bool or string;
* ``"accuracy"``: attack accuracies, may not drop by more than the baseline's
  CI width;
* ``"efficiency"``: measured / modelled throughput ratio, relative tolerance;
* ``"info"``: reported, never compared; value may be a number, bool, string
  or null.

A shard of a run (``bench run --shard I/N``) carries ``"shard": {"index": I,
"count": N}``; a document merged from N shards (``bench merge``) carries
``"merged_shards": N`` and ``"merged_by"`` (the git hash and dirty flag of the
checkout that merged them), and, when merged with ``--partial``,
``"missing_shards"``: the indices not merged. ``"code_digest"`` (sha256 of the
code's ``.py`` files, :func:`benchmarks.checkout.code_digest`) lets shards of one run come from
commits that differ only outside the code; a merge of such shards lists them
in ``"git_hashes"``.

``config.plugins`` lists every plugin loaded when the document was made (:mod:`attacks.plugins`: name,
distribution, version, sha256 ``digest`` of its source files, components); an empty list when none.
``"failed_components"`` (when present) lists the components a run dropped because they failed (import,
wrong shapes, non-finite values): ``{stage, kind, name, error}``; their metrics are absent.

Extra top-level keys are allowed (forward compatible); metric entries may only
hold the keys above plus an optional ``unit`` string.

Versioning (the rule every issue that adds to the results follows; also in docs/results.md):

* **minor** (``schema_minor``, :data:`SCHEMA_MINOR`): bump it when keys, runs or
  metrics are *added*. Readers accept every minor of their major, older or newer
  (absent means 0), and ``regress`` treats new runs and metrics as no change.
* **major** (``schema_version``, :data:`SCHEMA_VERSION`): bump it when a key, run or
  metric is *renamed or removed*, or a value changes meaning, and in the same change
  add the step from the old major to :data:`benchmarks.regress.MIGRATIONS`, so a
  committed baseline is compared under the new names without being regenerated.
  :func:`validate` refuses any other major with a one-line error (upgrade, or
  regenerate the file).
* Changing a metric's ``kind`` is neither: ``regress`` reports it (rule ``kind``),
  and the baseline is regenerated deliberately from a clean commit.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import math
import os
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.checkout import code_digest, git_state
from splitinfer import atomic

logger = logging.getLogger(__name__)

__all__ = [
    "KINDS",
    "SCHEMA_MINOR",
    "SCHEMA_VERSION",
    "SchemaError",
    "add_metric",
    "load",
    "plugin_change",
    "record_failure",
    "metric",
    "new_results",
    "read_json",
    "save",
    "validate",
]

SCHEMA_VERSION = 1  # major: bumped when a key, run or metric is renamed or removed (migration in regress)
SCHEMA_MINOR = 4  # bumped when keys, runs or metrics are added (3: missing_shards, merged_by, code_digest;
#                   4: config.plugins, failed_components)
KINDS = ("exact", "accuracy", "efficiency", "info")
_VERSIONED_PACKAGES = ("torch", "transformers", "numpy", "splitinfer")
_METRIC_REQUIRED = ("value", "ci_low", "ci_high", "n", "higher_is_better", "kind")
_METRIC_OPTIONAL = ("unit",)
_TOP_REQUIRED = ("schema_version", "suite", "config", "git_hash", "git_dirty", "versions", "date", "results")


class SchemaError(ValueError):
    """A results document (or a metric entry) does not follow the schema."""


# --------------------------------------------------------------------------
# value checks
# --------------------------------------------------------------------------


def _is_number(x: Any) -> bool:
    """A finite int or float (bools excluded)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _plain(x: Any) -> Any:
    """numpy scalars -> the equivalent Python scalar; anything else unchanged."""
    if type(x).__module__ == "numpy" and hasattr(x, "item"):
        return x.item()
    return x


def _describe(x: Any) -> str:
    text = repr(x)
    return f"{text[:60]}..." if len(text) > 60 else text


def _check_metric(m: Any, where: str) -> None:
    """Raise SchemaError naming ``where`` if ``m`` is not a valid metric entry."""
    if not isinstance(m, dict):
        raise SchemaError(f"{where} is not an object (got {type(m).__name__})")
    for key in _METRIC_REQUIRED:
        if key not in m:
            raise SchemaError(f"{where}.{key} is missing")
    extra = sorted(set(m) - set(_METRIC_REQUIRED) - set(_METRIC_OPTIONAL))
    if extra:
        allowed = list(_METRIC_REQUIRED + _METRIC_OPTIONAL)
        raise SchemaError(f"{where} has unknown key(s) {extra}; allowed: {allowed}")
    kind = m["kind"]
    if kind not in KINDS:
        raise SchemaError(f"{where}.kind is {_describe(kind)}, expected one of {list(KINDS)}")
    value = m["value"]
    if kind in ("accuracy", "efficiency"):
        if not _is_number(value):
            raise SchemaError(
                f"{where}.value is not a number (got {_describe(value)}); kind {kind!r} needs one"
            )
    elif kind == "exact":
        if not (_is_number(value) or isinstance(value, (bool, str))):
            raise SchemaError(
                f"{where}.value must be a finite number, bool or string (got {_describe(value)})"
            )
    elif not (value is None or _is_number(value) or isinstance(value, (bool, str))):
        raise SchemaError(
            f"{where}.value must be a finite number, bool, string or null (got {_describe(value)})"
        )
    lo, hi = m["ci_low"], m["ci_high"]
    for key, v in (("ci_low", lo), ("ci_high", hi)):
        if v is not None and not _is_number(v):
            raise SchemaError(f"{where}.{key} is not a number (got {_describe(v)})")
    if (lo is None) != (hi is None):
        raise SchemaError(f"{where}: ci_low and ci_high must both be numbers or both null")
    if lo is not None and lo > hi:
        raise SchemaError(f"{where}: ci_low {lo} is greater than ci_high {hi}")
    n = m["n"]
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
        raise SchemaError(f"{where}.n is not a non-negative integer (got {_describe(n)})")
    if not isinstance(m["higher_is_better"], bool):
        raise SchemaError(f"{where}.higher_is_better is not a bool (got {_describe(m['higher_is_better'])})")
    if "unit" in m and not isinstance(m["unit"], str):
        raise SchemaError(f"{where}.unit is not a string (got {_describe(m['unit'])})")


# --------------------------------------------------------------------------
# building
# --------------------------------------------------------------------------


def metric(
    value: Any,
    ci_low: float | None = None,
    ci_high: float | None = None,
    n: int | None = None,
    higher_is_better: bool = True,
    *,
    kind: str,
    unit: str | None = None,
) -> dict[str, Any]:
    """One validated metric entry; numpy scalars are turned into Python ones.

    ``kind`` is required (one of :data:`KINDS`) so that every metric states
    how it is compared against the baseline.
    """
    m: dict[str, Any] = {
        "value": _plain(value),
        "ci_low": _plain(ci_low),
        "ci_high": _plain(ci_high),
        "n": _plain(n),
        "higher_is_better": _plain(higher_is_better),
        "kind": kind,
    }
    if unit is not None:
        m["unit"] = unit
    _check_metric(m, "metric")
    return m


def plugin_change(before: list[dict] | None, after: list[dict] | None) -> str | None:
    """How the plugins of two documents' ``config.plugins`` differ (first difference, one phrase), or None.

    A plugin's changed digest or version, or one present on one side only, counts; the order does not.
    """
    old = {p["name"]: p for p in before or []}
    new = {p["name"]: p for p in after or []}
    for name in sorted(set(old) | set(new)):
        if name not in new:
            return f"plugin {name!r} is missing (it was loaded in the other run)"
        if name not in old:
            return f"plugin {name!r} was not loaded in the other run"
        for key in ("digest", "version", "dist"):
            if old[name].get(key) != new[name].get(key):
                a, b = str(old[name].get(key))[:12], str(new[name].get(key))[:12]
                return f"plugin {name!r} changed ({key} {a} -> {b})"
    return None


def package_versions() -> dict[str, str | None]:
    """Versions of python and the packages results depend on; None if not installed. ``torch_cpu_capability``
    (AVX2, AVX512, ...) names the instruction set torch's CPU kernels ran with: float results, and the digests
    of profiles calibrated from them, can differ in their last bits between machines that differ here."""
    import torch

    versions: dict[str, str | None] = {"python": platform.python_version(),
                                       "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}
    for name in _VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    if versions["splitinfer"] is None:  # running from a source checkout, not installed
        try:
            import splitinfer

            versions["splitinfer"] = getattr(splitinfer, "__version__", None)
        except ImportError:
            pass
    return versions


def new_results(
    config: dict[str, Any], suite: str, *, repo_dir: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """An empty results document for ``suite``.

    ``config`` is supplied by the caller (model + sha256, corpus manifests,
    split, seeds) and must be JSON-serialisable.  ``git_hash``/``git_dirty``
    describe the checkout at ``repo_dir`` (default: this source tree).
    """
    if not isinstance(suite, str) or not suite:
        raise SchemaError(f"suite must be a non-empty string, got {_describe(suite)}")
    if not isinstance(config, dict):
        raise SchemaError(f"config is not an object (got {type(config).__name__})")
    try:
        json.dumps(config, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"config is not JSON-serialisable: {exc}") from exc
    git_hash, dirty = git_state(repo_dir)
    from attacks.plugins import records

    config = {**config, "plugins": config.get("plugins", records())}  # provenance of every loaded plugin
    return {
        "schema_version": SCHEMA_VERSION,
        "schema_minor": SCHEMA_MINOR,
        "suite": suite,
        "config": config,
        "git_hash": git_hash,
        "git_dirty": dirty,
        "code_digest": code_digest(repo_dir),
        "versions": package_versions(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "results": {},
    }


def record_failure(results: dict[str, Any], stage: str, kind: str, name: str, error: Exception | str) -> None:
    """Note that component ``name`` (a ``kind``: attack, defense, ...) failed in ``stage`` and was left out.

    The run goes on without it; the entry is the document's account of what is missing (its metrics are never
    written), and ``bench run`` exits non-zero when any is listed.
    """
    line = f"{stage}: {kind} {name!r} left out: {error}"
    logger.warning("splitinfer: warning: %s", line)
    results.setdefault("failed_components", []).append(
        {"stage": stage, "kind": kind, "name": name, "error": str(error)})


def add_metric(
    results: dict[str, Any], run: str, name: str, metric: dict[str, Any], *, replace: bool = False
) -> None:
    """Store ``metric`` as ``results["results"][run][name]`` after validating it.

    Raises SchemaError if the entry is invalid, or if it already exists and
    ``replace`` is False.
    """
    for what, key in (("run", run), ("metric name", name)):
        if not isinstance(key, str) or not key:
            raise SchemaError(f"{what} must be a non-empty string, got {_describe(key)}")
    where = f"results[{run!r}][{name!r}]"
    entry = {k: _plain(v) for k, v in metric.items()} if isinstance(metric, dict) else metric
    _check_metric(entry, where)
    runs = results.setdefault("results", {})
    if not replace and name in runs.get(run, {}):
        raise SchemaError(f"{where} already exists; pass replace=True to overwrite it")
    runs.setdefault(run, {})[name] = entry


# --------------------------------------------------------------------------
# validation and I/O
# --------------------------------------------------------------------------


def validate(results: Any) -> None:
    """Raise SchemaError, naming the bad path, unless ``results`` follows the schema."""
    if not isinstance(results, dict):
        raise SchemaError(f"results document is not an object (got {type(results).__name__})")
    version = results.get("schema_version")
    if "schema_version" in results and (not isinstance(version, int) or isinstance(version, bool)):
        raise SchemaError(f"schema_version is not an integer (got {_describe(version)})")
    if version is not None and version != SCHEMA_VERSION:  # first: another version may lay its keys out otherwise
        hint = "written by a newer splitinfer; upgrade" if version > SCHEMA_VERSION else "regenerate it"
        raise SchemaError(f"schema_version is {version}, this code reads {SCHEMA_VERSION} ({hint})")
    for key in _TOP_REQUIRED:
        if key not in results:
            raise SchemaError(f"{key} is missing from the results document")
    minor = results.get("schema_minor", 0)
    if not isinstance(minor, int) or isinstance(minor, bool) or minor < 0:
        raise SchemaError(f"schema_minor is not a non-negative integer (got {_describe(minor)})")
    if not isinstance(results["suite"], str) or not results["suite"]:
        raise SchemaError(f"suite is not a non-empty string (got {_describe(results['suite'])})")
    if not isinstance(results["config"], dict):
        raise SchemaError(f"config is not an object (got {type(results['config']).__name__})")
    plugins = results["config"].get("plugins")
    if plugins is not None and not (isinstance(plugins, list) and all(
            isinstance(p, dict) and isinstance(p.get("name"), str) for p in plugins)):
        raise SchemaError(f"config.plugins is not a list of {{name, digest, version}} objects "
                          f"(got {_describe(plugins)})")
    if "shard" in results and not isinstance(results["shard"], dict):
        raise SchemaError(f"shard is not an object (got {type(results['shard']).__name__})")
    if not isinstance(results["git_hash"], str) or not results["git_hash"]:
        raise SchemaError(f"git_hash is not a non-empty string (got {_describe(results['git_hash'])})")
    if results["git_dirty"] is not None and not isinstance(results["git_dirty"], bool):
        raise SchemaError(f"git_dirty is not a bool or null (got {_describe(results['git_dirty'])})")
    versions = results["versions"]
    if not isinstance(versions, dict):
        raise SchemaError(f"versions is not an object (got {type(versions).__name__})")
    for pkg, ver in versions.items():
        if ver is not None and not isinstance(ver, str):
            raise SchemaError(f"versions[{pkg!r}] is not a string or null (got {_describe(ver)})")
    date = results["date"]
    try:
        datetime.fromisoformat(date)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"date is not an ISO 8601 timestamp (got {_describe(date)})") from exc
    runs = results["results"]
    if not isinstance(runs, dict):
        raise SchemaError(f"results is not an object (got {type(runs).__name__})")
    for run, metrics in runs.items():
        if not isinstance(metrics, dict):
            raise SchemaError(f"results[{run!r}] is not an object (got {type(metrics).__name__})")
        for name, m in metrics.items():
            _check_metric(m, f"results[{run!r}][{name!r}]")


def save(results: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Validate and write ``results`` as JSON (sorted keys, indent 2), atomically.

    Returns the path written.  Parent directories are created.
    """
    validate(results)
    path = Path(path)
    text = json.dumps(results, sort_keys=True, indent=2, allow_nan=False) + "\n"
    atomic.write_text(path, text)
    logger.info("results written to %s", path)
    return path


def read_json(path: str | os.PathLike[str]) -> Any:
    """The JSON in a results file, not yet validated; SchemaError with the path if it cannot be read."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise SchemaError(f"{path}: no such results file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise SchemaError(f"{path}: cannot read results file ({exc})") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise SchemaError(f"{path}: not valid JSON ({where}: {exc.msg})") from exc


def results_path(arg: str | os.PathLike[str]) -> Path:
    """A results document given as its file or as the directory that holds its ``results.json``."""
    p = Path(arg)
    return p / "results.json" if p.is_dir() else p


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a results file; SchemaError with the path for any problem."""
    results = read_json(path)
    try:
        validate(results)
    except SchemaError as exc:
        raise SchemaError(f"{path}: {exc}") from exc
    return results
