"""Per-step timing of split generation, and the step-time model of DESIGN.md section 6.

Each round trip through the cloud body is one :class:`StepTiming`; the
components add up to ``total_ms`` (``other_ms`` is the remainder: Python
overhead, streaming).

:class:`StepTimeModel` decomposes a step that sends ``T`` positions as

    t_step(T) = RTT + t_local(T) + t_cloud(T) + bytes(T) * 8 / bandwidth + t_overhead(T)

with every cost linear in ``T``, fitted by least squares from measured
steps (:func:`fit`), checked by k-fold cross-validation
(:func:`cross_validate`) and projected to other RTTs and bandwidths
(:meth:`StepTimeModel.project`). ``t_local`` is the head, tail, token
selection and the proposer; ``t_cloud`` the body; ``t_overhead`` the codec,
the remainder and whatever the link costs beyond its emulated delay.
``flat=True`` replaces the compute terms by their value at ``T = 1``: a
stand-in for accelerators, where verifying a few dozen positions costs
about as much as one. tok/s = tokens / sum of modelled step times, computed
in one place (:meth:`StepTimeModel.tok_s`).

The RTT study (the seed paper's section 6.3, extended) lives here too:
:func:`fit_pooled` fits one model to steps measured at several emulated
RTTs (each run's RTT subtracted), :func:`leave_one_rtt_out` checks it by
fitting on every RTT but one and predicting the held-out one,
:func:`seed_model_fit` is the seed's two-parameter ``a * RTT + b`` and
:func:`projections` the modelled tok/s at other RTTs and bandwidths.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

COMPONENTS = ("head_ms", "body_ms", "tail_ms", "codec_ms", "network_ms", "draft_ms", "other_ms")


@dataclass
class StepTiming:
    """Milliseconds of one round trip (one step), and what it carried."""

    head_ms: float = 0.0  # local head layers (+ embedding)
    body_ms: float = 0.0  # cloud body layers, as reported by the cloud
    tail_ms: float = 0.0  # local tail layers + norm + LM head + token selection / verification
    codec_ms: float = 0.0  # frame encode + decode, both sides
    network_ms: float = 0.0  # time on the wire (emulated WAN included)
    draft_ms: float = 0.0  # proposer: drafting and learning from the step
    other_ms: float = 0.0  # remainder of total_ms
    total_ms: float = 0.0
    tokens_sent: int = 0  # positions carried to the cloud (1 for a sequential step)
    tokens_committed: int = 0  # tokens this step added to the output
    draft_tokens: int = 0  # draft nodes sent besides the committed-next token
    draft_accepted: int = 0  # draft nodes on the accepted path
    bytes_up: int = 0
    bytes_down: int = 0

    def finish(self, total_ms: float) -> None:
        self.total_ms = total_ms
        parts = self.head_ms + self.body_ms + self.tail_ms + self.codec_ms + self.network_ms + self.draft_ms
        self.other_ms = max(0.0, total_ms - parts)

    def to_dict(self) -> dict:
        return asdict(self)


def mean_breakdown(steps: list[StepTiming], skip_first: bool = True) -> dict[str, float]:
    """Mean milliseconds per step for each component.

    The first step (the prompt's prefill) is skipped by default so the figures
    describe steady-state decoding; it is used when it is the only step.
    """
    use = steps[1:] if skip_first and len(steps) > 1 else steps
    if not use:
        return {k: 0.0 for k in (*COMPONENTS, "total_ms")}
    return {k: sum(getattr(s, k) for s in use) / len(use) for k in (*COMPONENTS, "total_ms")}


# ---------------------------------------------------------------------- least squares
Line = tuple[float, float]  # (intercept, slope): y = a + b * T


def linfit(x: Sequence[float], y: Sequence[float], slope_prior: float = 0.0) -> Line:
    """Least-squares line through (x, y); with fewer than two distinct x, slope = ``slope_prior``."""
    n = len(x)
    if n == 0:
        return 0.0, slope_prior
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((xi - mx) ** 2 for xi in x)
    if sxx <= 1e-12:
        return my - slope_prior * mx, slope_prior
    b = sum((xi - mx) * (yi - my) for xi, yi in zip(x, y)) / sxx
    return my - b * mx, b


def _at(line: Line, t: float) -> float:
    return line[0] + line[1] * t


def transfer_ms(nbytes: float, bandwidth_mbps: float | None) -> float:
    return 0.0 if not bandwidth_mbps else nbytes * 8 / (bandwidth_mbps * 1e3)


# ---------------------------------------------------------------------- the model
@dataclass(frozen=True)
class StepTimeModel:
    """Fitted linear costs of a step sending ``T`` positions, at a given RTT and bandwidth."""

    local: Line  # head + tail + selection + proposer, ms
    cloud: Line  # body, ms
    overhead: Line  # codec + remainder + link cost beyond the emulated delay, ms
    bytes: Line  # bytes up + down per step
    rtt_ms: float = 0.0
    bandwidth_mbps: float | None = None
    n_steps: int = 0

    def compute_ms(self, t: float, flat: bool = False) -> float:
        u = 1.0 if flat else t
        return max(0.0, _at(self.local, u)) + max(0.0, _at(self.cloud, u))

    def predict(self, t: float, flat: bool = False) -> float:
        """Modelled milliseconds of one step that sends ``t`` positions."""
        net = self.rtt_ms + transfer_ms(max(0.0, _at(self.bytes, t)), self.bandwidth_mbps)
        return net + self.compute_ms(t, flat) + max(0.0, _at(self.overhead, t))

    def project(self, rtt_ms: float, bandwidth_mbps: float | None) -> StepTimeModel:
        """The same machine's costs over another network."""
        return replace(self, rtt_ms=float(rtt_ms), bandwidth_mbps=bandwidth_mbps)

    def total_ms(self, steps: Sequence[StepTiming], flat: bool = False, add_draft_ms: bool = False) -> float:
        """Modelled milliseconds of these steps; ``add_draft_ms`` adds each step's measured drafting time
        (proposers that draft with the local model: their drafting does not grow with the positions sent, so
        the fit leaves it out)."""
        return sum(self.predict(s.tokens_sent, flat) + (s.draft_ms if add_draft_ms else 0.0) for s in steps)

    def tok_s(self, steps: Sequence[StepTiming], flat: bool = False, add_draft_ms: bool = False) -> float:
        """Modelled tokens per second of these steps (tokens committed / modelled time): the one place."""
        ms = self.total_ms(steps, flat, add_draft_ms)
        return 1e3 * sum(s.tokens_committed for s in steps) / ms if ms > 0 else 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> StepTimeModel:
        """The model :meth:`to_dict` wrote (JSON lists back to tuples)."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def _decode_steps(steps: Sequence[StepTiming], skip_prefill: bool) -> list[StepTiming]:
    return list(steps[1:]) if skip_prefill and len(steps) > 1 else list(steps)


def fit(
    steps: Sequence[StepTiming],
    rtt_ms: float = 0.0,
    bandwidth_mbps: float | None = None,
    skip_prefill: bool = True,
) -> StepTimeModel:
    """Fit the step-time model to measured steps taken over a link with this RTT and bandwidth.

    ``steps`` may pool several runs (pass each run's steps without its
    prefill, or leave ``skip_prefill`` to drop the first step). Steps whose
    total is more than 5 median absolute deviations off the first fit (a
    scheduler hiccup on a shared machine) are dropped and the fit repeated.
    """
    use = _decode_steps(steps, skip_prefill)
    model = _fit_once(use, rtt_ms, bandwidth_mbps)
    if len(use) >= 8:
        res = [s.total_ms - model.predict(s.tokens_sent) for s in use]
        med = sorted(res)[len(res) // 2]
        mad = sorted(abs(r - med) for r in res)[len(res) // 2] or 1e-9
        kept = [s for s, r in zip(use, res) if abs(r - med) <= 5 * 1.4826 * mad]
        if len(kept) >= max(4, len(use) // 2):
            model = _fit_once(kept, rtt_ms, bandwidth_mbps)
    return model


def _fit_once(use: Sequence[StepTiming], rtt_ms: float, bandwidth_mbps: float | None) -> StepTimeModel:
    t = [float(s.tokens_sent) for s in use]
    local = [s.head_ms + s.tail_ms + s.draft_ms for s in use]
    cloud = [s.body_ms for s in use]
    nbytes = [float(s.bytes_up + s.bytes_down) for s in use]
    b_line = linfit(t, nbytes, slope_prior=(sum(nbytes) / max(1.0, sum(t))) if use else 0.0)
    over = [
        s.codec_ms + s.other_ms + s.network_ms - rtt_ms - transfer_ms(s.bytes_up + s.bytes_down, bandwidth_mbps)
        for s in use
    ]
    return StepTimeModel(linfit(t, local), linfit(t, cloud), linfit(t, over), b_line, rtt_ms, bandwidth_mbps,
                         len(use))


def cross_validate(
    steps: Sequence[StepTiming],
    rtt_ms: float = 0.0,
    bandwidth_mbps: float | None = None,
    k: int = 5,
    skip_prefill: bool = True,
) -> dict[str, float]:
    """k-fold cross-validated error of :func:`fit` at predicting held-out steps' total time.

    Returns ``mape`` (median absolute percentage error per step), ``mean_abs_ms``
    and ``total_error`` (relative error of the summed time of the held-out steps).
    """
    use = _decode_steps(steps, skip_prefill)
    if len(use) < 2 * k:
        k = max(2, len(use) // 2)
    if len(use) < 4:
        return {"mape": math.nan, "mean_abs_ms": math.nan, "total_error": math.nan, "folds": 0}
    errs, abs_ms, pred_total, true_total = [], [], 0.0, 0.0
    for fold in range(k):
        train = [s for i, s in enumerate(use) if i % k != fold]
        test = [s for i, s in enumerate(use) if i % k == fold]
        model = fit(train, rtt_ms, bandwidth_mbps, skip_prefill=False)
        for s in test:
            p = model.predict(s.tokens_sent)
            abs_ms.append(abs(p - s.total_ms))
            errs.append(abs(p - s.total_ms) / max(1e-9, s.total_ms))
            pred_total += p
            true_total += s.total_ms
    errs.sort()
    return {
        "mape": errs[len(errs) // 2],
        "mean_abs_ms": sum(abs_ms) / len(abs_ms),
        "total_error": (pred_total - true_total) / true_total if true_total else math.nan,
        "folds": k,
    }


def predict(model: StepTimeModel, tokens_sent: int, flat: bool = False) -> float:
    """Modelled milliseconds of a step sending ``tokens_sent`` positions (see :meth:`StepTimeModel.predict`)."""
    return model.predict(tokens_sent, flat)


def project(model: StepTimeModel, rtt_ms: float, bandwidth_mbps: float | None) -> StepTimeModel:
    """``model`` over another network (see :meth:`StepTimeModel.project`)."""
    return model.project(rtt_ms, bandwidth_mbps)


# ---------------------------------------------------------------------- online cost for proposers
class OnlineStepCost:
    """Running estimate of ``t_step(T) = fixed + per_token * T`` for sizing drafts.

    The compute part (everything but the network) is fitted from the recent
    steps the verifier reports; the network part uses a *target* RTT and
    bandwidth (the deployment's, which may differ from the link in use).
    Until steps of two different sizes have been seen, the slope comes from
    the prefill step (``T`` = prompt length) or ``prior_token_ms``. ``rtt_ms``
    None: the RTT is the median network time of the recent steps (a real
    remote link, whose RTT nobody named).
    """

    def __init__(self, rtt_ms: float | None, bandwidth_mbps: float | None, window: int = 64,
                 prior_token_ms: float = 1.0):
        self.rtt_ms = None if rtt_ms is None else float(rtt_ms)
        self.bandwidth_mbps, self.window = bandwidth_mbps, window
        self.net: list[float] = []  # network time of recent steps, transfer at the target bandwidth taken out
        self.prior_token_ms = prior_token_ms
        self.samples: list[tuple[int, float, float]] = []  # (T, compute ms, bytes)
        self.prefill: tuple[int, float] | None = None

    def observe(self, timing: StepTiming) -> None:
        compute = max(0.0, timing.total_ms - timing.network_ms)
        if self.prefill is None and not self.samples and timing.tokens_sent > 1:
            self.prefill = (timing.tokens_sent, compute)
            return
        self.samples.append((timing.tokens_sent, compute, float(timing.bytes_up + timing.bytes_down)))
        self.net.append(max(0.0, timing.network_ms - transfer_ms(timing.bytes_up + timing.bytes_down,
                                                                 self.bandwidth_mbps)))
        del self.samples[: -self.window], self.net[: -self.window]

    def target_rtt_ms(self) -> float:
        """The RTT the draft is sized for: the named one, else the median measured network time."""
        if self.rtt_ms is not None:
            return self.rtt_ms
        return float(sorted(self.net)[len(self.net) // 2]) if self.net else 0.0

    def coefficients(self) -> tuple[float, float]:
        """(fixed_ms, per_token_ms) at the target network."""
        if not self.samples:
            return self.target_rtt_ms() + 50.0, self.prior_token_ms
        t = [s[0] for s in self.samples]
        prior = self.prior_token_ms
        if self.prefill is not None:
            base = min(s[1] for s in self.samples)
            prior = max(0.0, (self.prefill[1] - base) / max(1, self.prefill[0] - 1))
        a, b = linfit(t, [s[1] for s in self.samples], slope_prior=prior)
        b = max(0.0, b)
        ba, bb = linfit(t, [s[2] for s in self.samples], slope_prior=sum(s[2] for s in self.samples) / sum(t))
        fixed = self.target_rtt_ms() + max(0.0, a) + transfer_ms(max(0.0, ba), self.bandwidth_mbps)
        return fixed, b + transfer_ms(max(0.0, bb), self.bandwidth_mbps)


class StepCostModel:
    """A proposer's step-time model ``t(T) = fixed + per_token * T``: fixed, or learned by :class:`OnlineStepCost`.

    ``step_ms`` and ``token_ms`` (both or neither) fix it, for reproducible runs; otherwise it is fitted online
    from the steps observed, at the target RTT and bandwidth (``rtt_ms`` / ``bandwidth_mbps``, default: the
    run's link, given to :meth:`begin`). The one cost model of ``combined``, ``local-draft`` and ``feature-draft``.
    """

    def __init__(self, rtt_ms: float | None = None, bandwidth_mbps: float | None = None,
                 step_ms: float | None = None, token_ms: float | None = None):
        if (step_ms is None) != (token_ms is None):
            from splitinfer.errors import SplitInferError

            raise SplitInferError("give both step_ms and token_ms (a fixed cost model) or neither")
        self.rtt_ms, self.bandwidth_mbps = rtt_ms, bandwidth_mbps
        self.fixed = None if step_ms is None else (float(step_ms), float(token_ms))
        self.online = OnlineStepCost(rtt_ms or 0.0, bandwidth_mbps)

    def begin(self, link_rtt_ms: float, link_bandwidth_mbps: float | None) -> None:
        """A new request: forget the online fit. The target RTT is the one named (``rtt_ms``), else the
        emulated link's, else (a link with no RTT named: in-process, or a real remote server) the measured one."""
        rtt = self.rtt_ms if self.rtt_ms is not None else (link_rtt_ms or None)
        bw = link_bandwidth_mbps if self.bandwidth_mbps is None else self.bandwidth_mbps
        self.online = OnlineStepCost(rtt, bw)

    def observe(self, timing: StepTiming | None) -> None:
        if timing is not None and self.fixed is None:
            self.online.observe(timing)

    def coefficients(self) -> tuple[float, float]:
        """(fixed_ms, per_token_ms)."""
        return self.fixed if self.fixed is not None else self.online.coefficients()


# ---------------------------------------------------------------------- the RTT study
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
