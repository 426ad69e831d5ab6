"""The ``--defense`` / ``--defense-option`` flags every command that runs or attacks a split shares."""

from __future__ import annotations

import argparse

from splitinfer.defenses.pipeline import DefensePipeline


def add_defense_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--defense", default="none", metavar="NAME[+NAME]",
                   help="defense on the wire / the local layers, e.g. noise, quant, lora-random+noise, or the "
                        "canonical form noise(sigma=0.05,clip=8.0)+quant(format=int8) (default none; docs/defenses.md)")
    p.add_argument("--defense-option", action="append", default=[], metavar="[name.]KEY=VALUE",
                   help="a defense parameter (repeatable), e.g. noise.sigma=0.05 or quant.format=int4")


def defense_from_args(args: argparse.Namespace) -> DefensePipeline:
    """The composed defense the flags name (DefenseError, one line, on a bad spec)."""
    return DefensePipeline.parse(getattr(args, "defense", "none"), getattr(args, "defense_option", None) or [])
