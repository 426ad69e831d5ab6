"""--defense / --defense-option become a frozen DefenseFlags at the command-line edge."""

import argparse
import dataclasses

import pytest

from splitinfer.defenses.base import DefenseError
from splitinfer.defenses.cli_args import DefenseFlags, add_defense_args


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_defense_args(p)
    return p.parse_args(list(argv))


def test_flags_become_a_frozen_config_and_its_pipeline():
    flags = DefenseFlags.from_args(parse("--defense", "noise", "--defense-option", "noise.sigma=0.05"))
    assert flags == DefenseFlags("noise", ("noise.sigma=0.05",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        flags.spec = "quant"
    assert flags.pipeline().label.startswith("noise(sigma=0.05")
    assert DefenseFlags.from_args(parse()).pipeline().is_none


def test_a_bad_spec_is_a_defense_error():
    with pytest.raises(DefenseError, match="unknown defense 'nope'"):
        DefenseFlags.from_args(parse("--defense", "nope")).pipeline()
