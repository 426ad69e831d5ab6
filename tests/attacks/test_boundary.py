"""Boundary: the one parser of ``head:A`` / ``tail:B``, its checks against the model, and its depth."""

import pytest

from attacks.boundary import Boundary
from attacks.errors import AttackError


def test_boundary_parse_depth_and_limits() -> None:
    assert Boundary.parse("head:2") == Boundary("head", 2) and str(Boundary.parse(" tail:3 ")) == "tail:3"
    assert Boundary.parse("head:2").depth(30) == 2 and Boundary.parse("tail:4").depth(30) == 26
    for bad in ("mid:3", "head", "head:x", "head:-1", "2"):
        with pytest.raises(AttackError, match="bad boundary"):
            Boundary.parse(bad)
    for bad in ("head:0", "head:29", "tail:0", "tail:29"):
        with pytest.raises(AttackError, match=r"outside the model: it has 30 layers.*\[1, 28\]"):
            Boundary.parse(bad).depth(30)


def test_objects_pass_through_and_key_dicts() -> None:
    b = Boundary("tail", 3)
    assert Boundary.parse(b) is b and b.side == "tail" and b.layers == 3
    assert {Boundary("head", 2): 1}[Boundary.parse("head:2")] == 1  # code keys taps and jobs by boundary
