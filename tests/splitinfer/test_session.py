"""The body service's view of its callers for the batch scheduler (:mod:`splitinfer.session`)."""

from __future__ import annotations

import time

import pytest

from splitinfer.batch_scheduler import BatchConfig
from splitinfer.client import body_info
from splitinfer.partition import CloudBody, SplitConfig
from splitinfer.session import BodyService

SPLIT = SplitConfig(2, 2)


@pytest.fixture(scope="module")
def parts(tiny):
    body = CloudBody.from_model(tiny.model, SPLIT)
    return body, body_info("tiny-random", SPLIT, body, tiny.hidden_size, tiny.num_layers)


def _answer_twice(service: BodyService, owner: str, gap_s: float) -> float:
    """Two forwards of ``owner`` ``gap_s`` apart (answer to next request); the time the second was answered."""
    service._track(owner, +1)
    service._track(owner, -1)
    time.sleep(gap_s)
    service._track(owner, +1)
    service._track(owner, -1)
    return time.monotonic()


def test_a_caller_is_predicted_one_usual_gap_after_its_answer_within_the_hold(parts):
    body, info = parts
    held = BodyService(body, info, batch=BatchConfig(max_batch=8, window_ms=1, phase_ms=200))
    answered = _answer_twice(held, "a", 0.05)
    due = held._latest_arrival()
    assert answered + 0.04 <= due <= answered + 0.07  # about one 50 ms gap after its last answer
    assert held._expected_callers() == 1
    time.sleep(0.05 + 0.03)  # overdue by more than half its gap: it stopped, so nobody waits for it any more
    assert held._latest_arrival() == 0.0 and held._expected_callers() == 0

    plain = BodyService(body, info, batch=BatchConfig(max_batch=8, window_ms=1))
    _answer_twice(plain, "a", 0.05)
    time.sleep(0.01)
    assert plain._latest_arrival() == 0.0 and plain._expected_callers() == 0  # no hold: no predictions

    far = BodyService(body, info, batch=BatchConfig(max_batch=8, window_ms=1, phase_ms=10))
    _answer_twice(far, "a", 0.05)
    assert far._latest_arrival() == 0.0  # predicted 50 ms out, past a 10 ms hold
