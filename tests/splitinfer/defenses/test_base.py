"""Spec parsing, canonical labels, options and their one-line errors."""

import pytest

from splitinfer.defenses import DefenseError, DefensePipeline, list_defenses


@pytest.mark.parametrize("spec", ["noise(sigma=0.05,clip=8.0)+quant(format=int8)", "none",
                                  "lora-random(rank=4,scale=0.2,seed=3)+noise(sigma=0.1,clip=2.0,replies=true)",
                                  "random-split(depths=2,4,8)", "quant(format=int4,group=16,replies=false)"])
def test_label_round_trips(spec):
    p = DefensePipeline.parse(spec)
    assert p.label == spec
    assert DefensePipeline.parse(p.label).items == p.items


def test_options_override_and_prefix():
    p = DefensePipeline.parse("noise+quant", ["noise.sigma=0.2", "quant.format=fp8", "noise.replies=true"])
    assert p.label == "noise(sigma=0.2,clip=8.0,replies=true)+quant(format=fp8)"
    assert DefensePipeline.parse("noise", ["sigma=0.3"]).items[0].sigma == 0.3
    assert DefensePipeline.parse("noise", {"noise.clip": 4}).items[0].clip == 4.0


def test_public_label_drops_secrets_and_what_the_cloud_need_not_know():
    p = DefensePipeline.parse("lora-random(seed=9)+noise(sigma=0.1,seed=7,replies=true)+quant")
    assert p.public_label == "noise(sigma=0.1,clip=8.0,replies=true)+quant(format=int8)"
    assert DefensePipeline.parse("noise(seed=7)").public_label == "none"


@pytest.mark.parametrize("spec,options,needle", [
    ("nois", [], "unknown defense 'nois'; choose one of none, "),
    ("noise", ["sigma=-1"], "sigma=-1.0 must be >= 0"),
    ("noise", ["sigma=abc"], "must be a finite number; e.g. --defense-option noise.sigma="),
    ("noise+quant", ["sigma=1"], "ambiguous with 2 defenses; prefix it"),
    ("quant", ["format=int3"], "choose one of int8, fp8, int4"),
    ("noise", ["colour=red"], "has no parameter 'colour'; its parameters: sigma"),
    ("noise(sigma", [], "write NAME or NAME(KEY=VALUE,...)"),
    ("noise", ["sigma"], "write [name.]KEY=VALUE"),
    ("noise+noise", [], "names a defense twice"),
    ("noise", ["quant.format=int8"], "defense 'quant' is not in --defense"),
    ("random-split", ["depths=2,2"], "repeats a depth"),
    ("lora-random", ["rank=0"], "rank=0 must be >= 1"),
    ("lora-adv", ["rank=0"], "lora-adv: need rank >= 1 and steps >= 0; e.g. --defense-option lora-adv.rank=8"),
    ("noise", ["clip=inf"], "clip='inf' must be a finite number"),  # else (989, 1e-05)-DP with sensitivity inf
    ("noise", ["sigma=Infinity"], "sigma=inf must be a finite number"),
    ("noise(sigma=1,sigma=2)", [], "sets sigma twice; give each parameter once"),  # not silently the last
    ("lora-random", ["scale=inf"], "scale='inf' must be a finite number"),
    ("random-split", ["depths=2.5,4"], "must be comma-separated integers"),  # not silently depths=2,4
    ("random-split", ["depths=4.9"], "must be comma-separated integers"),
])
def test_bad_specs_give_one_line_errors(spec, options, needle):
    with pytest.raises(DefenseError) as e:
        DefensePipeline.parse(spec, options)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_every_defense_declares_a_strength_axis():
    rows = {r["name"]: r for r in list_defenses()}
    assert {"noise", "quant", "lora-random", "random-split"} <= set(rows)
    assert rows["noise"]["strength"] == ["sigma"] and rows["quant"]["strength"] == ["format"]
    assert all(r["strength"] for r in rows.values())


def test_record_states_the_guarantee_per_vector():
    rec = DefensePipeline.parse("noise(sigma=2.0,clip=1.0)").record()
    text = rec["items"][0]["describe"]
    assert "per released vector" in text and "not per token of text" in text and "2C = 2" in text
