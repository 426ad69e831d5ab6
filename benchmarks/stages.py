"""The stage registry of the benchmark harness: one frozen config per stage, one entry function each.

A suite file (:mod:`benchmarks.suite`) has one table per stage it runs. Each stage is
registered here with

- a frozen config dataclass (a subclass of :class:`StageConfig`) naming every key its
  table may hold and its type; a field left ``None`` means "the stage's own default",
  so a table runs exactly as the stage function reads it;
- its entry function, ``"module:function"``, imported only when the stage runs (so
  ``splitinfer bench ls`` and ``bench validate`` stay fast), called as
  ``entry(loaded_model, table, results)`` and returning the raw rows kept under the
  results' ``data``;
- a one-line summary for ``splitinfer bench ls``.

Every table may also set ``budget_s``: the stage's wall-time budget on the machine the
suite was sized for. The runner prints each stage's time against it and records both.

A stage registered ``shardable`` reads its shard from ``results`` (:class:`benchmarks.shard.Shard`) and runs
only its share of grid cells under ``bench run --shard I/N``; the others run in shard 0 only.

Adding a stage: write ``benchmarks/stage_<name>.py`` with one entry function, add its
config class and one :func:`register_stage` call below; order of registration is run order.
"""

from __future__ import annotations

import importlib
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from splitinfer.errors import SplitInferError


@dataclass(frozen=True)
class StageConfig:
    """Keys every stage table may hold."""

    budget_s: float | None = None  # wall-time budget of the stage in seconds (reported, never enforced)

    @classmethod
    def from_table(cls, table: dict, where: str) -> StageConfig:
        """Check ``table``'s keys and types (one-line SplitInferError naming ``where`` and the key) and build."""
        hints = typing.get_type_hints(cls)
        allowed = {f.name for f in fields(cls)}
        for key, value in table.items():
            if key not in allowed:
                raise SplitInferError(f"{where}: unknown key {key!r}; allowed: {', '.join(sorted(allowed))}")
            want = next(t for t in typing.get_args(hints[key]) if t is not type(None))
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                continue
            if not isinstance(value, want) or (isinstance(value, bool) and want is not bool):
                raise SplitInferError(f"{where}: {key} must be {want.__name__}, got {value!r}")
        if table.get("budget_s") is not None and table["budget_s"] <= 0:
            raise SplitInferError(f"{where}: budget_s must be > 0 seconds, got {table['budget_s']!r}")
        return cls(**table)

    def table(self) -> dict:
        """The keys the suite set (budget excluded): what the stage function reads."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "budget_s" and getattr(self, f.name) is not None}


@dataclass(frozen=True)
class GenerationKeys(StageConfig):
    """Keys of the stages that generate text: which proposers, how many tokens."""

    decodings: list | None = None
    tokens: int | None = None


@dataclass(frozen=True)
class LinkKeys(GenerationKeys):
    """... over an emulated link, with proposer options (``{name: {option: value}}``)."""

    rtt_ms: list | None = None
    bandwidth_mbps: float | None = None
    decoding_options: dict | None = None


@dataclass(frozen=True)
class ExactnessConfig(GenerationKeys):
    splits: list | None = None
    prompts: int | None = None


@dataclass(frozen=True)
class SpeedConfig(LinkKeys):
    head_depths: list | None = None
    tail_layers: int | None = None
    prompts_per_category: int | None = None
    categories: list | None = None
    wire_dtype: str | None = None


@dataclass(frozen=True)
class RttModelConfig(LinkKeys):
    split: str | None = None
    prompts: int | None = None
    project_rtt_ms: list | None = None


@dataclass(frozen=True)
class AttacksConfig(StageConfig):
    head_depths: list | None = None
    tail_depths: list | None = None
    attacks: list | None = None
    corpora: list | None = None
    train_tokens: int | None = None
    test_tokens: int | None = None
    max_length: int | None = None
    options: dict | None = None
    seed_protocol: bool | None = None
    wire_tokens: int | None = None  # output side: generated tokens per corpus scored on wire taps
    val_tokens: int | None = None
    defense: str | None = None


@dataclass(frozen=True)
class DefensesConfig(StageConfig):
    head_depths: list | None = None
    tail_layers: int | None = None
    defenses: list | None = None  # canonical specs, "none" = undefended
    attackers: list | None = None
    corpora: list | None = None
    train_tokens: int | None = None
    test_tokens: int | None = None
    max_length: int | None = None
    options: dict | None = None
    utility_sequences: int | None = None
    categories: list | None = None
    tokens: int | None = None
    decoding_options: dict | None = None
    overhead: list | None = None
    time_budget_s: float | None = None  # enforced: no new configuration starts after it (budget_s is reported only)
    paired_k: list | None = None  # known-plaintext pairs per paired attacker against privately changed local layers


@dataclass(frozen=True)
class NgramAblationConfig(StageConfig):
    n: list | None = None
    categories: list | None = None
    prompts_per_category: int | None = None
    tokens: int | None = None
    split: str | None = None
    lookahead_n: list | None = None


@dataclass(frozen=True)
class Stage:
    name: str
    config: type[StageConfig]
    entry: str  # "module:function"
    summary: str
    shardable: bool = False  # runs every N-th grid cell under --shard I/N (else: shard 0 only; benchmarks.shard)

    def function(self) -> Callable[[Any, dict, dict], Any]:
        module, _, name = self.entry.partition(":")
        return getattr(importlib.import_module(module), name)


STAGES: dict[str, Stage] = {}


def register_stage(name: str, config: type[StageConfig], entry: str, summary: str, shardable: bool = False) -> Stage:
    """Register stage ``name`` (run after every stage registered before it)."""
    if name in STAGES:
        raise SplitInferError(f"stage {name!r} is registered twice")
    STAGES[name] = Stage(name, config, entry, summary, shardable)
    return STAGES[name]


def get_stage(name: str) -> Stage:
    if name not in STAGES:
        raise SplitInferError(f"unknown stage {name!r}; known: {', '.join(STAGES)}")
    return STAGES[name]


register_stage("exactness", ExactnessConfig, "benchmarks.stage_speed:stage_exactness",
               "greedy split vs unsplit generation per split and decoding, fp32 on the wire")
register_stage("speed", SpeedConfig, "benchmarks.stage_speed:stage_speed",
               "measured and modelled tok/s per head depth x decoding x RTT")
register_stage("rtt_model", RttModelConfig, "benchmarks.stage_speed:stage_rtt_model",
               "leave-one-RTT-out fit of the step-time model, projected over RTTs")
register_stage("ngram_ablation", NgramAblationConfig, "benchmarks.stage_ablation:stage_ngram_ablation",
               "the seed paper's n-gram / lookahead ablation (tau per proposer and category)")
register_stage("attacks", AttacksConfig, "benchmarks.stage_attacks:stage_attacks",
               "inversion attackers trained and scored per head/tail depth and corpus", shardable=True)
register_stage("defenses", DefensesConfig, "benchmarks.stage_defenses:stage_defenses",
               "defense x strength x adaptive attacker per head depth: recovery, utility and cost", shardable=True)
