import math
import random

from splitinfer.timing import OnlineStepCost, StepCostModel, StepTiming, cross_validate, fit, linfit, predict, project


def synthetic(n=200, rtt=20.0, bw=100.0, noise=0.0, seed=0):
    """Steps from known linear costs: local 5+2T, cloud 10+3T, codec 0.5+0.01T, bytes 100+2000T."""
    rng = random.Random(seed)
    steps = []
    for _ in range(n):
        t = rng.choice([1, 1, 2, 4, 8, 16, 32])
        nbytes = 100 + 2000 * t
        s = StepTiming(tokens_sent=t, tokens_committed=1, bytes_up=nbytes // 2, bytes_down=nbytes - nbytes // 2)
        s.head_ms, s.tail_ms, s.body_ms = 1 + 0.5 * t, 4 + 1.5 * t, 10 + 3 * t
        s.codec_ms = 0.5 + 0.01 * t
        s.network_ms = rtt + nbytes * 8 / (bw * 1e3) + 0.3
        s.finish(s.head_ms + s.tail_ms + s.body_ms + s.codec_ms + s.network_ms + rng.gauss(0, noise) ** 2)
        steps.append(s)
    return steps


def test_linfit_and_degenerate_slope():
    a, b = linfit([1, 2, 3], [3, 5, 7])
    assert abs(a - 1) < 1e-9 and abs(b - 2) < 1e-9
    assert linfit([1, 1], [4, 6], slope_prior=1.0) == (4.0, 1.0)


def test_fit_recovers_the_components():
    m = fit(synthetic(), rtt_ms=20.0, bandwidth_mbps=100.0, skip_prefill=False)
    assert abs(m.local[0] - 5) < 1e-6 and abs(m.local[1] - 2) < 1e-6
    assert abs(m.cloud[1] - 3) < 1e-6 and abs(m.bytes[1] - 2000) < 1e-3
    assert abs(m.overhead[0] - 0.8) < 1e-6  # codec 0.5 + 0.3 of link cost beyond the emulated delay
    t8 = 20 + (5 + 16) + (10 + 24) + (100 + 16000) * 8 / 1e5 + 0.8 + 0.08
    assert abs(predict(m, 8) - t8) < 1e-6


def test_project_and_flat_compute():
    m = fit(synthetic(), 20.0, 100.0, skip_prefill=False)
    far = project(m, 80.0, 10.0)
    assert abs(far.predict(1) - m.predict(1) - 60 - (2100 * 8 / 1e4 - 2100 * 8 / 1e5)) < 1e-6
    assert far.predict(32, flat=True) < far.predict(32)
    assert abs(far.predict(32, flat=True) - far.predict(32) + (2 + 3) * 31) < 1e-6
    steps = [StepTiming(tokens_sent=1, tokens_committed=1)] * 4
    assert abs(m.tok_s(steps) - 1e3 / m.predict(1)) < 1e-9


def test_cross_validation_error_is_small_for_a_linear_truth():
    cv = cross_validate(synthetic(noise=1.0), 20.0, 100.0, k=5, skip_prefill=False)
    assert cv["folds"] == 5 and cv["mape"] < 0.05 and abs(cv["total_error"]) < 0.05
    assert math.isnan(cross_validate(synthetic(n=3), 20.0, 100.0)["mape"])


def test_online_cost_uses_prefill_as_slope_prior_then_fits():
    c = OnlineStepCost(rtt_ms=80.0, bandwidth_mbps=None)
    pre = StepTiming(tokens_sent=41, total_ms=5 + 40 * 3.0)
    c.observe(pre)
    c.observe(StepTiming(tokens_sent=1, total_ms=8.0))
    fixed, per = c.coefficients()
    assert abs(per - 117 / 40) < 1e-9 and abs(fixed - 80 - (8 - 117 / 40)) < 1e-9  # (125 - 8) / (41 - 1)
    for t in (1, 4, 8, 16):
        c.observe(StepTiming(tokens_sent=t, total_ms=10 + 2.0 * t, network_ms=0.5))
    fixed, per = c.coefficients()
    assert 1.5 < per < 2.5


def test_step_cost_model_fixed_or_online_at_the_target_network():
    import pytest

    from splitinfer.errors import SplitInferError

    fixed = StepCostModel(step_ms=90.0, token_ms=2.0)
    fixed.begin(20.0, None)
    fixed.observe(StepTiming(tokens_sent=4, total_ms=1000.0))  # a fixed model ignores observed steps
    assert fixed.coefficients() == (90.0, 2.0)
    link = StepCostModel()
    link.begin(20.0, None)
    target = StepCostModel(rtt_ms=80.0)
    target.begin(20.0, None)  # its own target RTT wins over the run's link
    for m in (link, target):
        for t in (1, 4, 8):
            m.observe(StepTiming(tokens_sent=t, total_ms=10 + 2.0 * t))
    (f_link, per_link), (f_target, per_target) = link.coefficients(), target.coefficients()
    assert abs(f_target - f_link - 60.0) < 1e-9 and abs(per_target - per_link) < 1e-9
    with pytest.raises(SplitInferError, match="both step_ms and token_ms"):
        StepCostModel(step_ms=90.0)


def test_without_a_named_rtt_the_draft_is_sized_for_the_measured_one():
    """A real remote link names no RTT (the link's emulated RTT is 0): size for what the steps measure, not 0."""
    measured, named = StepCostModel(), StepCostModel()
    measured.begin(0.0, None)
    named.begin(80.0, None)
    for m in (measured, named):
        for t in (1, 4, 8, 2, 6):
            m.observe(StepTiming(tokens_sent=t, total_ms=80.0 + 10 + 2.0 * t, network_ms=80.0))
    (f_measured, per_measured), (f_named, per_named) = measured.coefficients(), named.coefficients()
    assert abs(f_measured - f_named) < 1e-9 and abs(per_measured - per_named) < 1e-9
    assert abs(f_measured - 90.0) < 1e-6
    quiet = StepCostModel()
    quiet.begin(0.0, None)  # in-process: about zero network time, so sized for about RTT 0, as before
    for t in (1, 4, 8):
        quiet.observe(StepTiming(tokens_sent=t, total_ms=10 + 2.0 * t, network_ms=0.01))
    assert quiet.coefficients()[0] < 10.1
