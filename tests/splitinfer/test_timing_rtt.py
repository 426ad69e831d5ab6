import random

import pytest

from splitinfer import timing as rtt_model
from splitinfer.timing import StepTiming


def synthetic_steps(rtt, n=40, seed=0, local=10.0, cloud=20.0, over=1.0, per_token=0.5, bw=100.0):
    """Steps whose times follow the DESIGN section 6 model exactly (plus small noise)."""
    rng = random.Random(seed)
    steps = []
    for i in range(n):
        t = 1 + (i % 4) * 3
        nbytes = 2000 + 1000 * t
        s = StepTiming(head_ms=local / 2 + per_token * t, tail_ms=local / 2, body_ms=cloud + per_token * t,
                       codec_ms=over, tokens_sent=t, tokens_committed=1 + (i % 2), bytes_up=nbytes // 2,
                       bytes_down=nbytes // 2)
        s.network_ms = rtt + nbytes * 8 / (bw * 1e3) + rng.uniform(0, 0.2)
        s.finish(s.head_ms + s.tail_ms + s.body_ms + s.codec_ms + s.network_ms)
        steps.append(s)
    return steps


def test_leave_one_rtt_out_recovers_exact_model():
    runs = {r: synthetic_steps(r, seed=int(r)) for r in (0.0, 20.0, 50.0, 80.0)}
    cv = rtt_model.leave_one_rtt_out(runs, 100.0)
    assert len(cv["folds"]) == 4
    assert cv["max_rel_error"] < 0.01


def test_projection_and_flat_compute():
    runs = {r: synthetic_steps(r) for r in (0.0, 80.0)}
    model = rtt_model.fit_pooled(runs, 100.0)
    steps = runs[80.0]
    slow = rtt_model.modelled_tok_s(model, steps, 150.0, 100.0)
    fast = rtt_model.modelled_tok_s(model, steps, 5.0, 100.0)
    assert fast > slow > 0
    flat = rtt_model.modelled_tok_s(model, steps, 80.0, 100.0, flat=True)
    assert flat > rtt_model.modelled_tok_s(model, steps, 80.0, 100.0)  # multi-token steps cost less if flat
    rows = rtt_model.projections(model, steps, [5, 80], [100.0, 1000.0])
    assert len(rows) == 4 and all(r["tok_s"] > 0 for r in rows)


def test_seed_model_slope_is_one_for_pure_rtt():
    runs = {r: synthetic_steps(r) for r in (0.0, 40.0, 80.0)}
    fit = rtt_model.seed_model_fit(runs)
    assert fit["slope"] == pytest.approx(1.0, abs=0.02)

