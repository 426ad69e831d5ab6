"""The stage registry of the benchmark harness: one frozen config per stage, one entry function each.

A suite file (:mod:`benchmarks.suite`) has one table per stage it runs. Each stage is
registered here with

- the keys its table may hold and their types, as one ``"key:type ..."`` string, a list's items typed as
  ``key:list[int]`` (:func:`stage_config` makes it a frozen subclass of :class:`StageConfig`, which also
  refuses negative numbers, depths under 1 and malformed splits: :data:`AT_LEAST`, :data:`VALUE_CHECKS`); a field
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
    elements: typing.ClassVar[dict[str, type]] = {}  # list key -> the type of its items (``key:list[int]``)

    @classmethod
    def from_table(cls, table: dict, where: str) -> StageConfig:
        """Check ``table``'s keys and types (one-line SplitInferError naming ``where`` and the key) and build."""
        hints = typing.get_type_hints(cls)
        allowed = {f.name for f in fields(cls)}
        for key, value in table.items():
            if key not in allowed:
                raise SplitInferError(f"{where}: unknown key {key!r}; allowed: {', '.join(sorted(allowed))}")
            want = next(t for t in typing.get_args(hints[key]) if t is not type(None))
            if not _is_a(value, want):
                raise SplitInferError(f"{where}: {key} must be {want.__name__}, got {value!r}")
            items = value if isinstance(value, list) else [value]
            element = cls.elements.get(key)
            bad = next((x for x in items if not _is_a(x, element)), None) if element else None
            if bad is not None:
                raise SplitInferError(f"{where}: {key} must hold {element.__name__} values, got {bad!r} in {value!r}")
            if any(isinstance(x, float) and not math.isfinite(x) for x in items):
                what = "hold finite numbers" if isinstance(value, list) else "be a finite number"
                raise SplitInferError(f"{where}: {key} must {what}, got {value!r}")
            least = AT_LEAST.get(key, 0)
            if any(_is_a(x, float) and (x < least or (key in ABOVE_ZERO and x <= 0)) for x in items):
                bound = f"> 0{' seconds' if key.endswith('_s') else ''}" if key in ABOVE_ZERO else f">= {least}"
                what = f"hold numbers {bound}" if isinstance(value, list) else f"be {bound}"
                raise SplitInferError(f"{where}: {key} must {what}, got {value!r}")
            for x in items if key in VALUE_CHECKS else []:
                VALUE_CHECKS[key](x, f"{where}: {key}")
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
ITEM_TYPES = {"int": int, "float": float, "str": str}  # ``key:list[T]``
# Numbers in a table are counts, sizes, depths or times: never negative; these keys need more.
AT_LEAST = {"head_depths": 1, "tail_depths": 1, "tail_layers": 1, "prompts": 1, "tokens": 1,
            "prompts_per_category": 1}
ABOVE_ZERO = {"budget_s", "time_budget_s", "bandwidth_mbps"}


def _is_a(value, want: type) -> bool:
    """``isinstance`` with TOML's numbers: an int is a float; a bool is neither."""
    if isinstance(value, bool):
        return want is bool
    return isinstance(value, (int, float) if want is float else want)


def _split(text, where: str) -> None:
    from splitinfer.partition import SplitConfig

    try:
        split = SplitConfig.parse(text)
    except SplitInferError:
        split = None
    if split is None or min(split.head_layers, split.tail_layers) < 1:
        raise SplitInferError(f"{where}: bad split {text!r}; write it as HEAD,TAIL layer counts of at least 1, "
                              "e.g. 2,2")


def _category(name: str, where: str) -> None:
    from benchmarks.prompts import CATEGORIES

    if name not in CATEGORIES:
        raise SplitInferError(f"{where}: unknown prompt category {name!r}; choose from {', '.join(CATEGORIES)}")


def _scored_set(table: dict, where: str) -> None:
    from benchmarks.scored_set import ScoredSetConfig

    try:
        ScoredSetConfig.from_suite({"scored_set": table})
    except SplitInferError as e:
        raise SplitInferError(f"{where}: {e}") from None


def _wire_dtype(name: str, where: str) -> None:
    from splitinfer.cli_flags import WIRE_DTYPES

    if name not in WIRE_DTYPES:
        raise SplitInferError(f"{where}: unknown wire dtype {name!r}; choose from {', '.join(WIRE_DTYPES)}")


# key -> check of one value or list item, raising a one-line SplitInferError
VALUE_CHECKS = {"splits": _split, "split": _split, "categories": _category, "scored_set": _scored_set,
                "wire_dtype": _wire_dtype}


def stage_config(name: str, keys: str) -> type[StageConfig]:
    """A frozen :class:`StageConfig` subclass with the fields ``keys`` names (``"key:type ..."``, each default None)."""
    spec, elements = [], {}
    for item in keys.split():
        key, _, kind = item.partition(":")
        outer, _, inner = kind.removesuffix("]").partition("[")
        if outer not in KEY_TYPES or (inner and (outer != "list" or inner not in ITEM_TYPES)):
            raise SplitInferError(f"stage {name!r}: key {key!r} has type {kind!r}; use one of {', '.join(KEY_TYPES)} "
                                  f"or list[T] with T one of {', '.join(ITEM_TYPES)}")
        spec.append((key, KEY_TYPES[outer] | None, None))
        if inner:
            elements[key] = ITEM_TYPES[inner]
    title = "".join(part.title() for part in name.split("_"))
    config = make_dataclass(f"{title}Config", spec, bases=(StageConfig,), frozen=True)
    config.__module__ = __name__
    config.elements = elements
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
GENERATION = "decodings:list[str] tokens:int"
LINK = f"{GENERATION} rtt_ms:list[float] bandwidth_mbps:float decoding_options:dict"
ATTACK_DATA = "corpora:list[str] train_tokens:int test_tokens:int max_length:int options:dict"

register_stage("exactness", "benchmarks.stage_speed:stage_exactness", f"{GENERATION} splits:list[str] prompts:int",
               "greedy split vs unsplit generation per split and decoding, fp32 on the wire")
register_stage("speed", "benchmarks.stage_speed:stage_speed",
               f"{LINK} head_depths:list[int] tail_layers:int prompts_per_category:int categories:list[str] "
               "wire_dtype:str", "measured and modelled tok/s per head depth x decoding x RTT")
register_stage("rtt_model", "benchmarks.stage_speed:stage_rtt_model",
               f"{LINK} split:str prompts:int project_rtt_ms:list[float]",
               "leave-one-RTT-out fit of the step-time model, projected over RTTs")
register_stage("ngram_ablation", "benchmarks.stage_ablation:stage_ngram_ablation",
               "prompts_per_category:int tokens:int split:str",
               "the seed paper's n-gram / lookahead ablation at n = 3..7 (tau per proposer and category)")
# attacks: wire_tokens = generated tokens per corpus scored on wire taps (the output side)
register_stage("attacks", "benchmarks.stage_attacks:stage_attacks",
               f"head_depths:list[int] tail_depths:list[int] attacks:list[str] {ATTACK_DATA} "
               "wire_tokens:int val_tokens:int defense:str scored_set:dict max_doc_tokens:int",
               "inversion attackers trained and scored per head/tail depth and corpus", shardable=True)
# defenses: canonical specs ("none" = undefended); time_budget_s is enforced (no new configuration starts
# after it), budget_s only reported; paired_k = known-plaintext pairs per paired attacker against privately
# changed local layers
register_stage("defenses", "benchmarks.stage_defenses:stage_defenses",
               f"head_depths:list[int] tail_layers:int defenses:list[str] attackers:list[str] {ATTACK_DATA} "
               "utility_positions:int greedy_prompts:int scored_set:dict max_doc_tokens:int n_boot:int "
               "rows_elsewhere:str categories:list[str] tokens:int decoding_options:dict overhead:list[str] "
               "time_budget_s:float paired_k:list[int]",
               "defense x strength x adaptive attacker per head depth: recovery, utility and cost", shardable=True)
