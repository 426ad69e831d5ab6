"""attacks.defended.applies: which attack recipes the defenses stage runs against which defense."""

from __future__ import annotations

from attacks.defended import applies
from attacks.registry import get_attack_class
from splitinfer.defenses import DefensePipeline


def test_applies_to_and_refuses():
    noise, quant = DefensePipeline.parse("noise(sigma=0.1)"), DefensePipeline.parse("quant(format=int8)")
    none, perm = DefensePipeline.parse("none"), DefensePipeline.parse("permute(mode=signed)")
    whitened, relaxed = get_attack_class("vocab-match-whitened"), get_attack_class("relaxed-inversion")
    assert applies(whitened, noise) and not applies(whitened, quant) and not applies(whitened, none)
    assert applies(relaxed, none) and applies(relaxed, noise) and not applies(relaxed, perm)
    assert all(applies(get_attack_class("vocab-match-adaptive"), p) for p in (noise, quant, none, perm))
    assert applies(get_attack_class("session-average"), DefensePipeline.parse("noise(sigma=0.1)+quant(format=int8)"))
