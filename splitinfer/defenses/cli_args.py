"""The ``--defense`` / ``--defense-option`` flags every command that runs or attacks a split shares.

:meth:`DefenseFlags.from_args` turns them into a frozen config at the command-line edge; code below it
takes the config (or the :class:`DefensePipeline` it builds), never the argparse namespace.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from splitinfer.defenses.pipeline import DefensePipeline


def add_defense_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--defense", default="none", metavar="NAME[+NAME]",
                   help="defense on the wire / the local layers, e.g. noise, quant, lora-random+noise, or the "
                        "canonical form noise(sigma=0.05,clip=8.0)+quant(format=int8) (default none; docs/defenses.md)")
    p.add_argument("--defense-option", action="append", default=[], metavar="[name.]KEY=VALUE",
                   help="a defense parameter (repeatable), e.g. noise.sigma=0.05 or quant.format=int4")


@dataclass(frozen=True)
class DefenseFlags:
    """What ``--defense`` and ``--defense-option`` chose: the spec and the ``[name.]KEY=VALUE`` overrides."""

    spec: str = "none"
    options: tuple[str, ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DefenseFlags:
        return cls(args.defense, tuple(args.defense_option))

    def pipeline(self) -> DefensePipeline:
        """The composed defense the flags name (DefenseError, one line, on a bad spec)."""
        return DefensePipeline.parse(self.spec, list(self.options))
