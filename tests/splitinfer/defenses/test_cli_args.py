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


def test_fresh_secrets_draw_every_unset_secret_seed_and_keep_the_rest():
    flags = DefenseFlags("noise(sigma=0.1)+lora-random(rank=2)", ("lora-random.seed=7",))
    a, b = flags.pipeline(fresh_secrets=True), flags.pipeline(fresh_secrets=True)
    assert a.get("noise").seed != 0 and a.get("noise").seed != b.get("noise").seed  # the public default 0 is gone
    assert a.get("lora-random").seed == b.get("lora-random").seed == 7  # what the user set is kept
    assert a.get("noise").sigma == 0.1 and a.get("noise").clip == b.get("noise").clip
    assert flags.pipeline().get("noise").seed == 0  # the harness keeps the recorded default
    assert DefenseFlags("noise(seed=0)").pipeline(fresh_secrets=True).get("noise").seed == 0  # explicit, even 0
    assert DefenseFlags("quant(format=int8)").pipeline(fresh_secrets=True).label == "quant(format=int8)"


def test_the_shareable_label_leaves_drawn_seeds_out():
    pipe = DefenseFlags("noise(sigma=0.1)").pipeline(fresh_secrets=True)
    assert "seed=" in pipe.label and pipe.shareable_label == "noise(sigma=0.1,clip=8.0)"


def test_describe_leaves_every_secret_out():
    for spec in ("noise(sigma=0.1)", "lora-random(rank=2)", "permute", "random-split", "quant(format=int8)"):
        pipe = DefenseFlags(spec).pipeline(fresh_secrets=True)
        assert all("seed=" not in line for line in pipe.describe()), (spec, pipe.describe())
