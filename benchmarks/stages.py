"""The stage registry of the benchmark harness: one frozen config per stage, one entry function each.

A suite file (:mod:`benchmarks.suite`) has one table per stage it runs. Each stage is
registered here with

- the keys its table may hold and their types, as one ``"key:type ..."`` string
  (:func:`stage_config` makes it a frozen subclass of :class:`StageConfig`); a field
  left ``None`` means "the stage's own default", so a table runs exactly as the stage
  function reads it;
- its entry function, ``"module:function"``, imported only when the stage runs (so
  ``splitinfer bench ls`` and ``bench validate`` stay fast), called as
  ``entry(loaded_model, table, results)`` and returning the raw rows kept under the
  results' ``data``;
- a one-line summary for ``splitinfer bench ls``.

Every table may also set ``budget_s``: the stage's wall-time budget on the machine the
suite was sized for. The runner prints each stage's time against it and records both.

A stage registered ``shardable`` reads its shard from ``results`` (:class:`benchmarks.shard.Shard`) and runs
only its share of grid cells under ``bench run --shard I/N``; the others run in shard 0 only.

Adding a stage: write ``benchmarks/stage_<name>.py`` with one entry function and add one
:func:`register_stage` call below; order of registration is run order.
"""

from __future__ import annotations

import importlib
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields, make_dataclass
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
            numbers = value if isinstance(value, list) else [value]
            if any(isinstance(x, float) and not math.isfinite(x) for x in numbers):
                what = "hold finite numbers" if isinstance(value, list) else "be a finite number"
                raise SplitInferError(f"{where}: {key} must {what}, got {value!r}")
        if table.get("budget_s") is not None and table["budget_s"] <= 0:
            raise SplitInferError(f"{where}: budget_s must be > 0 seconds, got {table['budget_s']!r}")
        return cls(**table)

    def table(self) -> dict:
        """The keys the suite set (budget excluded): what the stage function reads."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "budget_s" and getattr(self, f.name) is not None}


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


KEY_TYPES = {"list": list, "dict": dict, "int": int, "float": float, "str": str, "bool": bool}


def stage_config(name: str, keys: str) -> type[StageConfig]:
    """A frozen :class:`StageConfig` subclass with the fields ``keys`` names (``"key:type ..."``, each default None)."""
    spec = []
    for item in keys.split():
        key, _, kind = item.partition(":")
        if kind not in KEY_TYPES:
            raise SplitInferError(f"stage {name!r}: key {key!r} has type {kind!r}; use one of {', '.join(KEY_TYPES)}")
        spec.append((key, KEY_TYPES[kind] | None, None))
    title = "".join(part.title() for part in name.split("_"))
    config = make_dataclass(f"{title}Config", spec, bases=(StageConfig,), frozen=True)
    config.__module__ = __name__
    return config


def register_stage(name: str, entry: str, keys: str, summary: str, shardable: bool = False) -> Stage:
    """Register stage ``name`` with its table's ``keys`` (see :func:`stage_config`); run after every earlier one."""
    if name in STAGES:
        raise SplitInferError(f"stage {name!r} is registered twice")
    STAGES[name] = Stage(name, stage_config(name, keys), entry, summary, shardable)
    return STAGES[name]


def get_stage(name: str) -> Stage:
    if name not in STAGES:
        raise SplitInferError(f"unknown stage {name!r}; known: {', '.join(STAGES)}")
    return STAGES[name]


# Key groups: stages that generate text; ... over an emulated link, with proposer options
# (decoding_options: {name: {option: value}}); the attack data of the stages that train and score attackers.
GENERATION = "decodings:list tokens:int"
LINK = f"{GENERATION} rtt_ms:list bandwidth_mbps:float decoding_options:dict"
ATTACK_DATA = "corpora:list train_tokens:int test_tokens:int max_length:int options:dict"

register_stage("exactness", "benchmarks.stage_speed:stage_exactness", f"{GENERATION} splits:list prompts:int",
               "greedy split vs unsplit generation per split and decoding, fp32 on the wire")
register_stage("speed", "benchmarks.stage_speed:stage_speed",
               f"{LINK} head_depths:list tail_layers:int prompts_per_category:int categories:list wire_dtype:str",
               "measured and modelled tok/s per head depth x decoding x RTT")
register_stage("rtt_model", "benchmarks.stage_speed:stage_rtt_model", f"{LINK} split:str prompts:int project_rtt_ms:list",
               "leave-one-RTT-out fit of the step-time model, projected over RTTs")
register_stage("ngram_ablation", "benchmarks.stage_ablation:stage_ngram_ablation",
               "n:list categories:list prompts_per_category:int tokens:int split:str lookahead_n:list",
               "the seed paper's n-gram / lookahead ablation (tau per proposer and category)")
# attacks: wire_tokens = generated tokens per corpus scored on wire taps (the output side)
register_stage("attacks", "benchmarks.stage_attacks:stage_attacks",
               f"head_depths:list tail_depths:list attacks:list {ATTACK_DATA} seed_protocol:bool wire_tokens:int "
               "val_tokens:int defense:str scored_set:dict max_doc_tokens:int", "inversion attackers trained and scored per head/tail depth and corpus",
               shardable=True)
# defenses: canonical specs ("none" = undefended); time_budget_s is enforced (no new configuration starts
# after it), budget_s only reported; paired_k = known-plaintext pairs per paired attacker against privately
# changed local layers
register_stage("defenses", "benchmarks.stage_defenses:stage_defenses",
               f"head_depths:list tail_layers:int defenses:list attackers:list {ATTACK_DATA} utility_positions:int "
               "greedy_prompts:int scored_set:dict max_doc_tokens:int n_boot:int rows_elsewhere:str "
               "categories:list tokens:int decoding_options:dict overhead:list time_budget_s:float paired_k:list",
               "defense x strength x adaptive attacker per head depth: recovery, utility and cost", shardable=True)
