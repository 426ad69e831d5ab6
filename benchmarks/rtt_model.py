"""RTT decomposition of split-decoding step time (the seed paper's section 6.3, extended).

The seed models a step as ``RTT + fixed overhead``. We fit the full model of
DESIGN.md section 6 (:mod:`splitinfer.timing`: local, cloud and overhead costs
linear in the positions sent, plus bytes over the bandwidth) to steps measured
at several emulated RTTs, pooled after subtracting each run's RTT, and check
it by **leave-one-RTT-out** cross-validation: fit on every RTT but one, predict
the mean step time at the held-out RTT, compare with the measurement. The
fitted model then projects tok/s to other RTTs and bandwidths.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from splitinfer.timing import StepTimeModel, StepTiming, fit


def at_zero_rtt(steps: Sequence[StepTiming], rtt_ms: float) -> list[StepTiming]:
    """The steps as if measured over a link without the emulated RTT (network time minus the RTT)."""
    return [replace(s, network_ms=max(0.0, s.network_ms - rtt_ms), total_ms=s.total_ms - rtt_ms) for s in steps]


def fit_pooled(runs: dict[float, list[StepTiming]], bandwidth_mbps: float | None) -> StepTimeModel:
    """Fit one model to decode steps measured at several RTTs ({rtt_ms: steps without prefill})."""
    pooled = [s for rtt, steps in runs.items() for s in at_zero_rtt(steps, rtt)]
    return fit(pooled, rtt_ms=0.0, bandwidth_mbps=bandwidth_mbps, skip_prefill=False)


def modelled_tok_s(model: StepTimeModel, steps: Sequence[StepTiming], rtt_ms: float,
                   bandwidth_mbps: float | None, flat: bool = False) -> float:
    """tok/s the model predicts for these steps (their tokens sent/committed) over the given network."""
    return model.project(rtt_ms, bandwidth_mbps).tok_s(steps, flat=flat)


def leave_one_rtt_out(runs: dict[float, list[StepTiming]], bandwidth_mbps: float | None) -> dict:
    """Per held-out RTT: measured vs predicted mean step ms and the relative error; plus the mean error."""
    rows = []
    for held in sorted(runs):
        rest = {r: s for r, s in runs.items() if r != held}
        if not rest or not runs[held]:
            continue
        model = fit_pooled(rest, bandwidth_mbps).project(held, bandwidth_mbps)
        measured = statistics.mean(s.total_ms for s in runs[held])
        predicted = statistics.mean(model.predict(s.tokens_sent) for s in runs[held])
        rows.append({"rtt_ms": held, "measured_ms": measured, "predicted_ms": predicted,
                     "rel_error": abs(predicted - measured) / measured})
    mean_err = statistics.mean(r["rel_error"] for r in rows) if rows else float("nan")
    max_err = max((r["rel_error"] for r in rows), default=float("nan"))
    return {"folds": rows, "mean_rel_error": mean_err, "max_rel_error": max_err}


def seed_model_fit(runs: dict[float, list[StepTiming]]) -> dict:
    """The seed's two-parameter model, per_step = a * RTT + b, by least squares over mean step times."""
    xs = sorted(runs)
    ys = [statistics.mean(s.total_ms for s in runs[r]) for r in xs]
    if len(xs) < 2:
        return {"slope": float("nan"), "intercept_ms": ys[0] if ys else float("nan")}
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return {"slope": slope, "intercept_ms": my - slope * mx}


def projections(model: StepTimeModel, steps: Sequence[StepTiming], rtts_ms: Sequence[float],
                bandwidths_mbps: Sequence[float | None]) -> list[dict]:
    """Modelled tok/s (CPU-measured compute, and flat per-step compute as on a GPU) per RTT and bandwidth."""
    rows = []
    for bw in bandwidths_mbps:
        for rtt in rtts_ms:
            rows.append({"rtt_ms": rtt, "bandwidth_mbps": bw,
                         "tok_s": modelled_tok_s(model, steps, rtt, bw),
                         "tok_s_flat_compute": modelled_tok_s(model, steps, rtt, bw, flat=True)})
    return rows
