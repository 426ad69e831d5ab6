"""Typed KEY=VALUE options: a value given on the command line or in a suite file takes the type of its default.

Defense parameters, decoding options and attack hyper-parameters all come in as ``KEY=VALUE`` text (or TOML
scalars) and are checked here, one way, before anything runs: ``epochs=abc`` or ``step_ms=nan`` is refused up
front with the type wanted, instead of failing after minutes of extraction or running with a NaN.
"""

from __future__ import annotations

import json
import math
from typing import Any


class OptionTypeError(ValueError):
    """``value`` cannot take the type of its default; ``want`` says what it must be."""

    def __init__(self, want: str):
        super().__init__(want)
        self.want = want


def parse_option_value(text: str) -> Any:
    """A JSON scalar when the text parses as one (``3``, ``0.5``, ``true``, ``null``), else the string itself."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, (bool, int, float, str)) or value is None else text


def coerce_option(value: Any, default: Any) -> Any:
    """``value`` as the type of ``default`` (bool, int, float or tuple of ints); a str, list or ``None`` default takes
    any value (the recipe checks it: a str default is often a sentinel such as ``"auto"`` that also accepts numbers).

    Raises :class:`OptionTypeError` when it cannot: a bool must be true/false (never ``"no"`` read as true), an int
    must be whole (2.5 never becomes 2), a float must be finite.
    """
    if isinstance(default, bool):
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        if isinstance(value, bool):
            return value
        raise OptionTypeError("true or false")
    if isinstance(default, tuple):
        items = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) \
            else [value]
        parsed = [parse_option_value(str(v).strip()) for v in items if str(v).strip()]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in parsed):
            raise OptionTypeError("comma-separated integers")
        return tuple(parsed)
    if isinstance(default, float):
        number = parse_option_value(value) if isinstance(value, str) else value
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
            raise OptionTypeError("a finite number")
        return float(number)
    if isinstance(default, int):
        number = parse_option_value(value) if isinstance(value, str) else value
        if isinstance(number, float) and number.is_integer():
            number = int(number)
        if isinstance(number, bool) or not isinstance(number, int):
            raise OptionTypeError("an integer")
        return number
    return value  # a str default (often a sentinel such as "auto" beside numbers), a list or None: taken as given
