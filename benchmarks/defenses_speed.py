"""Speed columns of a defense row for the privacy-vs-speed plot: tok/s at 80 ms per decoding, CPU and GPU-like.

For each decoding strategy run under the defense (``sequential``, ``combined``), the step-time model
(DESIGN.md section 6, :func:`splitinfer.timing.fit`) is fitted on that run's measured steps and projected to
80 ms RTT and 100 Mbit/s; tok/s is given with this CPU's compute (``cpu``) and with the model's flat per-step
compute (``gpu_flat``: every step costs what a one-position step costs, as on an accelerator where verifying a
draft is as cheap as one token), the ``tok/s flat`` column of the speed report. The prefill step is left out,
so a run whose every generation stopped at its first token has no speed: None, never 0 (:func:`measured_tok_s`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from splitinfer.timing import fit

__all__ = ["RTT_MS", "BANDWIDTH_MBPS", "measured_tok_s", "speed_columns"]

RTT_MS = 80.0
BANDWIDTH_MBPS = 100.0


def speed_columns(runs: Mapping[str, Sequence]) -> dict:
    """``{"tok_s_80ms": {decoding: {"cpu": tok/s, "gpu_flat": tok/s}}}`` from ``{decoding: [GenerationResult]}``."""
    out = {}
    for decoding, results in runs.items():
        model = fit([s for r in results for s in r.steps], 0.0, None).project(RTT_MS, BANDWIDTH_MBPS)
        steps = [s for r in results for s in r.steps[1:]]
        out[decoding] = {"cpu": model.tok_s(steps) if steps else None,
                         "gpu_flat": model.tok_s(steps, flat=True) if steps else None}
    return {"tok_s_80ms": out}


def measured_tok_s(value: float | None) -> float | None:
    """A stored tok/s at 80 ms, or None where no decode step was timed (every generation stopped at its first
    token, as under strong noise). Grids run before None was written there stored 0.0; a committed token over a
    positive modelled time is never 0, so 0.0 reads as None too."""
    return None if value is None or value <= 0 else float(value)
