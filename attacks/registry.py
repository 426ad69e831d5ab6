"""Registry of inversion-attack recipes: ``@register_attack("name")`` in each file of :mod:`attacks.recipes`.

:func:`make_attack` builds a recipe by name, :func:`list_attacks` describes
every recipe (name, threat model, requirements, boundary side),
:func:`load_attack` loads any checkpoint written by
:meth:`attacks.base.InversionAttack.save`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attacks.base import RECIPE_THREAT_MODELS, REQUIREMENTS, SIDES, Attack, read_config
from attacks.errors import AttackError
from splitinfer.registry import claim, import_modules, lookup

log = logging.getLogger(__name__)

__all__ = ["register_attack", "make_attack", "list_attacks", "get_attack_class", "load_attack", "registered_attacks"]

_REGISTRY: dict[str, type[Attack]] = {}


def register_attack(name: str) -> Callable[[type[Attack]], type[Attack]]:
    """Class decorator: register an :class:`~attacks.base.Attack` subclass under ``name`` (sets ``cls.name``)."""

    def deco(cls: type[Attack]) -> type[Attack]:
        if not (isinstance(cls, type) and issubclass(cls, Attack)):
            raise AttackError(f"@register_attack({name!r}) must decorate an Attack subclass (InversionAttack or "
                              f"DepthIdentifier), got {cls!r}")
        if cls.threat_model not in RECIPE_THREAT_MODELS:
            raise AttackError(f"attack {name!r} declares threat model {cls.threat_model!r}; use one of "
                              f"{RECIPE_THREAT_MODELS} (shadow labels results against privately changed victims)")
        if cls.boundary_side not in SIDES:
            raise AttackError(f"attack {name!r} declares boundary side {cls.boundary_side!r}; use one of {SIDES}")
        bad = sorted(set(cls.requires) - set(REQUIREMENTS))
        if bad:
            raise AttackError(f"attack {name!r} requires unknown resources {bad}; known: {sorted(REQUIREMENTS)}")
        return claim(_REGISTRY, name, cls, "attack", AttackError)

    return deco


def _load_recipes() -> None:
    """Import every module of :mod:`attacks.recipes` (each registers its attacks)."""
    import attacks.recipes as pkg

    import_modules("attacks.recipes", Path(pkg.__file__).parent)


def registered_attacks() -> dict[str, type[Attack]]:
    """The live registry, built-ins loaded: {name: class} (:mod:`attacks.plugins` snapshots it around a plugin)."""
    _load_recipes()
    return _REGISTRY


def get_attack_class(name: str) -> type[Attack]:
    """The registered class of ``name``, or AttackError listing the known names."""
    _load_recipes()
    return lookup(_REGISTRY, name, "attack", AttackError, "see `splitinfer attack list`")


def make_attack(name: str, **kwargs: Any) -> Attack:
    """Build the attack ``name`` (kwargs: ``model=``, ``seed=`` and the recipe's hyper-parameters)."""
    return get_attack_class(name)(**kwargs)


def list_attacks() -> list[dict[str, Any]]:
    """One description per registered recipe, sorted by name."""
    _load_recipes()
    return [_REGISTRY[n].describe() for n in sorted(_REGISTRY)]


def load_attack(directory: str | Path, model: Any = None) -> Attack:
    """Load any attack checkpoint written by :meth:`Attack.save` (``model``: a LoadedModel, for recipes
    needing weights; its sha256 must match the checkpoint's)."""
    cfg = read_config(directory)
    return get_attack_class(cfg["recipe"]).restore(directory, cfg, model=model)
