"""Defenses for split inference: transforms on the wire and private local layers (one module each).

``DefensePipeline.parse("noise(sigma=0.05)+quant(format=int8)")`` builds a
composed defense; see :mod:`splitinfer.defenses.base` for the spec grammar and
docs/defenses.md for each defense's parameters and threat model.
"""

from splitinfer.defenses.base import (
    Defense,
    DefenseError,
    get_defense_class,
    list_defenses,
    register_defense,
)
from splitinfer.defenses.pipeline import DefensePipeline, check_public, check_specs

__all__ = ["Defense", "DefenseError", "DefensePipeline", "check_public", "check_specs", "get_defense_class",
           "list_defenses", "register_defense"]
