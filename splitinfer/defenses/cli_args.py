"""The ``--defense`` / ``--defense-option`` flags every command that runs or attacks a split shares.

:meth:`DefenseFlags.from_args` turns them into a frozen config at the command-line edge; code below it
takes the config (or the :class:`DefensePipeline` it builds), never the argparse namespace.

Secret seeds (noise draws, the random LoRA, the permutation, the random split's draw) default to 0 in the
configs, which anyone who reads this code knows: an attacker who knows a noise seed regenerates the noise
and subtracts it. The commands that run a real split (``generate``, ``serve``) therefore draw a fresh secret
seed from the operating system for every secret seed the user did not set (:meth:`DefenseFlags.pipeline`
with ``fresh_secrets``); the harness (``attack``, ``bench``) keeps explicit, recorded seeds, because there
the victim is simulated and every figure must reproduce.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import secrets
from dataclasses import dataclass

from splitinfer.defenses.base import given_params
from splitinfer.defenses.pipeline import DefensePipeline

log = logging.getLogger(__name__)


def add_defense_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--defense", default="none", metavar="NAME[+NAME]",
                   help="defense on the wire / the local layers, e.g. noise, quant, lora-random+noise, or the "
                        "canonical form noise(sigma=0.05,clip=8.0)+quant(format=int8) (default none; docs/defenses.md)")
    p.add_argument("--defense-option", action="append", default=[], metavar="[name.]KEY=VALUE",
                   help="a defense parameter (repeatable), e.g. noise.sigma=0.05 or quant.format=int4; a secret "
                        "seed left unset is drawn fresh from the OS by generate and serve (set NAME.seed=N to "
                        "repeat a run)")


@dataclass(frozen=True)
class DefenseFlags:
    """What ``--defense`` and ``--defense-option`` chose: the spec and the ``[name.]KEY=VALUE`` overrides."""

    spec: str = "none"
    options: tuple[str, ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DefenseFlags:
        return cls(args.defense, tuple(args.defense_option))

    def pipeline(self, fresh_secrets: bool = False) -> DefensePipeline:
        """The composed defense the flags name (DefenseError, one line, on a bad spec); with ``fresh_secrets``
        every secret ``seed`` the flags leave unset is drawn from the OS (:mod:`secrets`), never the public 0."""
        pipe = DefensePipeline.parse(self.spec, list(self.options))
        if not fresh_secrets:
            return pipe
        given = given_params(self.spec, list(self.options))
        items = []
        for d in pipe.items:
            if "seed" in d.secret and "seed" not in given.get(d.name, set()):
                d = dataclasses.replace(d, seed=secrets.randbits(62))
                log.info("%s: no seed given; drew a fresh secret seed (set %s.seed=N to repeat a run)", d.name, d.name)
            items.append(d)
        return DefensePipeline(items)
