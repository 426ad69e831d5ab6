"""Defense configs, their registry and the ``--defense`` / ``--defense-option`` vocabulary.

A defense is a frozen dataclass registered with ``@register_defense("name")``
in its own module of this package. Each declares

- ``strength``: the names of the fields that make up its strength axis
  (noise: ``sigma``; quant: ``format``; lora-random: ``rank`` and ``scale``...),
- ``secret``: fields that are the user's secret (noise seeds, adapter seeds) and
  so never leave the local side (the hello's public part omits them),
- ``kind``: ``"wire"`` (transforms the states on the wire: see
  :mod:`splitinfer.defenses.pipeline`) or ``"model"`` (changes the local layers or
  the split).

Spec grammar (one string, the canonical label is the same form)::

    spec   := "none" | item ("+" item)*
    item   := NAME | NAME "(" KEY=VALUE ("," KEY=VALUE)* ")"

e.g. ``noise(sigma=0.05,clip=8.0)+quant(format=int8)``; list values are
comma-separated (``random-split(depths=2,4,8)``). ``--defense-option
[name.]KEY=VALUE`` overrides one field (the ``name.`` prefix is required when
several defenses are composed). Values are JSON scalars when they parse, else
strings.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from splitinfer.errors import SplitInferError
from splitinfer.options import OptionTypeError, coerce_option, parse_option_value
from splitinfer.registry import claim, import_modules, lookup

__all__ = ["DefenseError", "Defense", "register_defense", "list_defenses", "get_defense_class", "parse_items",
           "given_params", "format_items", "parse_option_value", "registered_defenses"]


class DefenseError(SplitInferError):
    """A bad defense spec or parameter (the message names the fix)."""


class Defense:
    """Base of every defense config (subclasses are frozen dataclasses)."""

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "wire"
    strength: ClassVar[tuple[str, ...]] = ()
    secret: ClassVar[tuple[str, ...]] = ()
    shown: ClassVar[tuple[str, ...]] = ()  # fields the label always shows (besides strength); others when not default
    attackers: ClassVar[tuple[str, ...]] = ()  # adaptive attackers it brings (a plugin's): scored beside the suite's

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:  # override: raise DefenseError naming the bad value and the fix
        """Check the parameters."""

    @property
    def cloud_must_know(self) -> bool:
        """True when the cloud must run its side of the defense (then the hello carries its public part)."""
        return False

    def params(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def public_params(self) -> dict[str, Any]:
        return {k: v for k, v in self.params().items() if k not in self.secret}

    def label(self, public: bool = False) -> str:
        """Canonical ``name(k=v,...)``: strength and ``shown`` fields, others where not default; ``public``
        leaves the secret fields out."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        params = {k: v for k, v in (self.public_params() if public else self.params()).items()
                  if k in self.strength or k in self.shown or v != defaults[k]}
        return f"{self.name}({','.join(f'{k}={_fmt(v)}' for k, v in params.items())})" if params else self.name

    def strength_value(self) -> dict[str, Any]:
        """This config's position on its strength axis."""
        return {k: getattr(self, k) for k in self.strength}

    def describe(self) -> str:
        """A one-line human description (override for guarantees such as epsilon); never shows a secret field
        (run summaries print it: ``generate --json``'s ``defense_detail``)."""
        return self.label(public=True)


_REGISTRY: dict[str, type[Defense]] = {}


def register_defense(name: str) -> Callable[[type], type]:
    """Class decorator: register a frozen-dataclass :class:`Defense` under ``name``."""

    def deco(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, Defense) and dataclasses.is_dataclass(cls)):
            raise DefenseError(f"@register_defense({name!r}) must decorate a Defense dataclass, got {cls!r}")
        if not cls.__dataclass_params__.frozen:
            raise DefenseError(f"defense {name!r} must be a frozen dataclass")
        fields = {f.name for f in dataclasses.fields(cls)}
        if cls.kind not in ("wire", "model") or not set(cls.strength) <= fields or not set(cls.secret) <= fields:
            raise DefenseError(f"defense {name!r}: kind must be wire|model and strength/secret must name its fields")
        return claim(_REGISTRY, name, cls, "defense", DefenseError)

    return deco


def _load() -> None:
    from pathlib import Path

    # this package's defense modules, found by directory (importing the package here would be a cycle)
    import_modules("splitinfer.defenses", Path(__file__).parent, skip=("base", "pipeline", "keyed", "cli_args"))


def registered_defenses() -> dict[str, type[Defense]]:
    """The live registry, built-ins loaded: {name: class}."""
    _load()
    return _REGISTRY


def get_defense_class(name: str) -> type[Defense]:
    _load()
    return lookup(_REGISTRY, name, "defense", DefenseError, "see docs/defenses.md", also=("none",))


def list_defenses() -> list[dict[str, Any]]:
    """Name, kind, strength axis and defaults of every registered defense."""
    _load()
    return [{"name": n, "kind": c.kind, "strength": list(c.strength), "defaults": c().params()}
            for n, c in sorted(_REGISTRY.items())]


# ---------------------------------------------------------------------- parsing
_KEY = re.compile(r"^[a-z][a-z0-9_]*$")
_SPLIT_PARAMS = re.compile(r",(?=\s*[a-z][a-z0-9_]*\s*=)")  # commas that start a new KEY=


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ",".join(_fmt(v) for v in value)
    return repr(value) if isinstance(value, float) else str(value)


def _coerce(cls: type[Defense], key: str, value: Any) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if key not in fields:
        raise DefenseError(f"defense {cls.name!r} has no parameter {key!r}; its parameters: {', '.join(fields)}")
    default = fields[key].default
    try:
        return str(value) if isinstance(default, str) else coerce_option(value, default)
    except OptionTypeError as e:
        raise DefenseError(f"defense {cls.name!r}: parameter {key}={value!r} must be {e.want}; "
                           f"e.g. --defense-option {cls.name}.{key}={_fmt(default)}") from None


def _split_items(spec: str) -> list[str]:
    items, depth, cur = [], 0, ""
    for ch in spec:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "+" and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    return [i.strip() for i in items]


def parse_items(spec: str, options: Iterable[str] | dict[str, Any] = ()) -> list[Defense]:
    """Defense configs from a spec (``none`` -> []) and ``[name.]KEY=VALUE`` overrides."""
    out = []
    for name, params in _raw_items(spec, options):
        cls = get_defense_class(name)
        try:
            out.append(cls(**{k: _coerce(cls, k, v) for k, v in params.items()}))
        except TypeError as e:
            raise DefenseError(f"defense {name!r}: {e}") from None
    return out


def given_params(spec: str, options: Iterable[str] | dict[str, Any] = ()) -> dict[str, set[str]]:
    """{defense name: the parameters the spec or the options set explicitly} (the rest take their defaults)."""
    return {name: set(params) for name, params in _raw_items(spec, options)}


def _raw_items(spec: str, options: Iterable[str] | dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """[(name, {key: raw value})] of a spec with the overrides applied, in spec order (values not yet coerced)."""
    spec = (spec or "none").strip()
    raw: list[tuple[str, dict[str, Any]]] = []
    if spec != "none":
        for item in _split_items(spec):
            m = re.fullmatch(r"([a-z][a-z0-9-]*)(?:\((.*)\))?", item)
            if not m:
                raise DefenseError(f"cannot parse defense {item!r}; write NAME or NAME(KEY=VALUE,...), "
                                   "e.g. noise(sigma=0.05,clip=8.0)+quant(format=int8)")
            params: dict[str, Any] = {}
            for kv in _SPLIT_PARAMS.split(m.group(2)) if m.group(2) else []:
                key, eq, value = kv.partition("=")
                if not eq or not _KEY.match(key.strip()):
                    raise DefenseError(f"bad parameter {kv!r} in defense {item!r}; write KEY=VALUE")
                if key.strip() in params:
                    raise DefenseError(f"defense {item!r} sets {key.strip()} twice; give each parameter once")
                params[key.strip()] = parse_option_value(value.strip())
            raw.append((m.group(1), params))
    names = [n for n, _ in raw]
    if len(set(names)) != len(names):
        raise DefenseError(f"defense spec {spec!r} names a defense twice; compose each defense once")
    opts = options.items() if isinstance(options, dict) else (_split_option(o) for o in options)
    for key, value in opts:
        target, _, field = key.rpartition(".")
        if not target:
            if len(raw) != 1:
                raise DefenseError(f"--defense-option {key}=... is ambiguous with {len(raw)} defenses; "
                                   f"prefix it with the defense's name, e.g. {names[0] if names else 'noise'}.{key}")
            target = raw[0][0]
        if target not in names:
            raise DefenseError(f"--defense-option {key}: defense {target!r} is not in --defense {spec!r}")
        raw[names.index(target)][1][field] = value
    return raw


def _split_option(option: str) -> tuple[str, Any]:
    key, eq, value = str(option).partition("=")
    if not eq or not key.strip():
        raise DefenseError(f"bad --defense-option {option!r}; write [name.]KEY=VALUE, e.g. noise.sigma=0.05")
    return key.strip(), parse_option_value(value.strip())


def format_items(items: Iterable[Defense], public: bool = False) -> str:
    """The canonical label (``none`` for no defense)."""
    labels = [d.label(public) for d in items]
    return "+".join(labels) if labels else "none"
