"""Benchmark suites: TOML files under ``benchmarks/suites/`` (or any path).

A suite names a model and seed and has one table per stage (see
:mod:`benchmarks.stages` for the stages and their keys); a stage that is absent
is skipped. Unknown keys and wrong types are one-line errors, so a typo never
silently drops a measurement. Every stage table may set ``budget_s``, its
wall-time budget. See ``benchmarks/suites/quick.toml`` for every key with comments. ``plugins = [...]``
loads plugin modules (:mod:`attacks.plugins`; dotted names, or ``.py`` paths relative to the suite file)
when the suite is loaded, so its tables may name their components.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.stages import STAGES, StageConfig, get_stage
from splitinfer.errors import SplitInferError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SUITES_DIR = Path(__file__).parent / "suites"

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # a suite's name becomes a folder under reports/
TOP_KEYS = {"name": str, "description": str, "model": str, "seed": int, "dtype": str, "device": str, "plugins": list}


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    model: str
    seed: int
    dtype: str = "fp32"
    device: str = "cpu"
    stages: dict = field(default_factory=dict)  # stage name -> its table as the stage reads it (no budget_s)
    path: str = ""
    configs: dict = field(default_factory=dict)  # stage name -> its frozen StageConfig
    plugins: tuple = ()  # plugin modules the suite loads (dotted names, or .py paths relative to the suite file)

    def stage(self, name: str) -> dict | None:
        return self.stages.get(name)

    def budget_s(self, name: str) -> float | None:
        """The wall-time budget the suite gives stage ``name`` (None: none given)."""
        cfg: StageConfig | None = self.configs.get(name)
        return None if cfg is None else cfg.budget_s


def suite_path(name_or_path: str) -> Path:
    """``NAME`` -> benchmarks/suites/NAME.toml; a ``.toml`` path as is; one-line error when there is none."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = SUITES_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        raise SplitInferError(f"no suite {name_or_path!r}: known suites are {', '.join(list_suites())}, "
                              "or pass a .toml path")
    return path


def list_suites() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.toml"))


def _check_top(top: dict, where: str) -> None:
    for key, value in top.items():
        if key not in TOP_KEYS:
            raise SplitInferError(f"{where}: unknown key {key!r}; allowed: {', '.join(sorted(TOP_KEYS))}")
        want = TOP_KEYS[key]
        if not isinstance(value, want) or isinstance(value, bool):
            raise SplitInferError(f"{where}: {key} must be {want.__name__}, got {value!r}")
    if top.get("seed", 0) < 0:
        raise SplitInferError(f"{where}: seed must be >= 0, got {top['seed']!r}")
    if "dtype" in top:
        from splitinfer.models import DTYPES

        if top["dtype"] not in DTYPES:
            raise SplitInferError(f"{where}: unknown dtype {top['dtype']!r}; choose one of {', '.join(DTYPES)}")


def load_suite(name_or_path: str) -> Suite:
    """Load ``NAME`` from benchmarks/suites/NAME.toml, or a TOML file path; validate every key."""
    path = suite_path(name_or_path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise SplitInferError(f"suite file {path} is not valid TOML: {e}") from None
    except UnicodeDecodeError:
        raise SplitInferError(f"suite file {path} is not UTF-8 text; save it as UTF-8 (TOML requires it)") from None
    top = {k: v for k, v in data.items() if not isinstance(v, dict)}
    _check_top(top, str(path))
    configs = {}
    for name, table in data.items():
        if not isinstance(table, dict):
            continue
        if name not in STAGES:
            raise SplitInferError(f"{path}: unknown stage [{name}]; known: {', '.join(STAGES)}")
        configs[name] = get_stage(name).config.from_table(table, f"{path} [{name}]")
    for key in ("name", "model"):
        if key not in top:
            raise SplitInferError(f"{path}: missing top-level key {key!r}")
    if not NAME_RE.fullmatch(top["name"]):
        raise SplitInferError(f"{path}: name {top['name'][:80]!r} must be a plain identifier (letters, digits, '_' "
                              "and '-', at most 64, no path separators or dots): it names the report's folder")
    plugins = top.get("plugins", [])
    if not all(isinstance(p, str) and p for p in plugins):
        raise SplitInferError(f"{path}: plugins must list module names or .py paths, got {plugins!r}")
    if plugins:
        from attacks.plugins import load_modules

        load_modules(plugins, relative_to=path.parent)
    return Suite(top["name"], top.get("description", ""), top["model"], int(top.get("seed", 0)),
                 top.get("dtype", "fp32"), top.get("device", "cpu"),
                 {name: cfg.table() for name, cfg in configs.items()}, str(path), configs, tuple(plugins))
