"""Benchmark suites: TOML files under ``benchmarks/suites/`` (or any path).

A suite names a model and seed and has one table per stage; a stage that is
absent is skipped. Unknown keys are errors, so a typo never silently drops a
measurement. See ``benchmarks/suites/quick.toml`` for every key with comments.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from splitinfer.errors import SplitInferError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SUITES_DIR = Path(__file__).parent / "suites"

STAGE_KEYS: dict[str, dict[str, type | tuple]] = {
    "exactness": {"splits": list, "prompts": int, "tokens": int, "decodings": list},
    "speed": {"head_depths": list, "tail_layers": int, "decodings": list, "rtt_ms": list, "bandwidth_mbps": float,
              "prompts_per_category": int, "categories": list, "tokens": int, "wire_dtype": str,
              "decoding_options": dict},
    "rtt_model": {"split": str, "decodings": list, "rtt_ms": list, "bandwidth_mbps": float, "prompts": int,
                  "tokens": int, "project_rtt_ms": list, "decoding_options": dict},
    "attacks": {"head_depths": list, "tail_depths": list, "attacks": list, "corpora": list, "train_tokens": int,
                "test_tokens": int, "max_length": int, "options": dict, "seed_protocol": bool},
    "ngram_ablation": {"n": list, "categories": list, "prompts_per_category": int, "tokens": int,
                       "split": str, "lookahead_n": list},
    "defenses": {"head_depths": list, "tail_layers": int, "defenses": list, "attackers": list, "corpora": list,
                 "train_tokens": int, "test_tokens": int, "max_length": int, "options": dict,
                 "utility_sequences": int, "categories": list, "tokens": int, "decoding_options": dict,
                 "overhead": list, "time_budget_s": float},
}
TOP_KEYS = {"name": str, "description": str, "model": str, "seed": int, "dtype": str, "device": str}


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    model: str
    seed: int
    dtype: str = "fp32"
    device: str = "cpu"
    stages: dict = field(default_factory=dict)  # stage name -> its table
    path: str = ""

    def stage(self, name: str) -> dict | None:
        return self.stages.get(name)


def _check_types(table: dict, allowed: dict, where: str) -> None:
    for key, value in table.items():
        if key not in allowed:
            raise SplitInferError(f"{where}: unknown key {key!r}; allowed: {', '.join(sorted(allowed))}")
        want = allowed[key]
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            continue
        if not isinstance(value, want) or isinstance(value, bool) and want is not bool:
            raise SplitInferError(f"{where}: {key} must be {want.__name__}, got {value!r}")


def load_suite(name_or_path: str) -> Suite:
    """Load ``NAME`` from benchmarks/suites/NAME.toml, or a TOML file path; validate every key."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = SUITES_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in SUITES_DIR.glob("*.toml")))
        raise SplitInferError(f"no suite {name_or_path!r}: known suites are {known}, or pass a .toml path")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise SplitInferError(f"suite file {path} is not valid TOML: {e}") from None
    top = {k: v for k, v in data.items() if not isinstance(v, dict)}
    _check_types(top, TOP_KEYS, str(path))
    stages = {k: v for k, v in data.items() if isinstance(v, dict)}
    for stage, table in stages.items():
        if stage not in STAGE_KEYS:
            raise SplitInferError(f"{path}: unknown stage [{stage}]; known: {', '.join(STAGE_KEYS)}")
        _check_types(table, STAGE_KEYS[stage], f"{path} [{stage}]")
    for key in ("name", "model"):
        if key not in top:
            raise SplitInferError(f"{path}: missing top-level key {key!r}")
    return Suite(top["name"], top.get("description", ""), top["model"], int(top.get("seed", 0)),
                 top.get("dtype", "fp32"), top.get("device", "cpu"), stages, str(path))
