"""KEY=VALUE options take their default's type, one way for defenses, decodings and attacks."""

from __future__ import annotations

import math

import pytest

from splitinfer.options import OptionTypeError, coerce_option


@pytest.mark.parametrize("value, default, want", [
    ("3", 1, 3), (3.0, 1, 3), ("0.5", 1.0, 0.5), (2, 1.0, 2.0), ("true", False, True), ("FALSE", True, False),
    ("1,2", (4,), (1, 2)), ([1, 2], (4,), (1, 2)), (7, "auto", 7), ("x", None, "x"), (math.nan, None, math.nan),
    ([1, 2], [3], [1, 2]),
])
def test_values_take_the_type_of_their_default(value, default, want) -> None:
    got = coerce_option(value, default)
    assert type(got) is type(want) and (got == want or (got != got and want != want))


@pytest.mark.parametrize("value, default, want", [
    ("abc", 1, "an integer"), (2.5, 1, "an integer"), (True, 1, "an integer"),
    ("abc", 1.0, "a finite number"), ("nan", 1.0, "a finite number"), (math.inf, 1.0, "a finite number"),
    (True, 1.0, "a finite number"), ("no", True, "true or false"), (1, True, "true or false"),
    ("1,2.5", (4,), "comma-separated integers"),
])
def test_values_that_cannot_take_the_type_are_refused(value, default, want) -> None:
    with pytest.raises(OptionTypeError) as info:
        coerce_option(value, default)
    assert info.value.want == want
