"""The global budget of bytes in flight (:mod:`splitinfer.inflight`), with stand-in connections."""

from __future__ import annotations

from splitinfer.inflight import InflightBudget, default_limit_bytes


class Conn:
    def __init__(self):
        self.paused = False

    def budget_pause(self):
        self.paused = True

    def budget_resume(self):
        self.paused = False


def test_beyond_the_limit_the_connection_is_paused_and_resumed_oldest_first_when_bytes_go_back():
    budget = InflightBudget(100)
    a, b, c = Conn(), Conn(), Conn()
    budget.start()  # a request is being processed: nobody is let through for want of progress
    budget.charge(a, 60)
    budget.charge(b, 50)  # 110 > 100
    budget.charge(c, 10)
    assert (a.paused, b.paused, c.paused) == (False, True, True) and budget.used == 120
    budget.release(a, 60)  # a's message answered: 60 <= 100, both resume
    assert not b.paused and not c.paused and budget.used == 60 and budget.peak == 120
    budget.finish()


def test_a_full_budget_of_half_received_messages_does_not_stall():
    budget = InflightBudget(100)
    a, b = Conn(), Conn()
    budget.charge(a, 90)
    budget.charge(b, 20)  # paused, but nothing is processed: nothing would release bytes, so b goes on
    assert not b.paused
    budget.charge(b, 20)  # b keeps its turn until its message is answered
    assert not b.paused and not a.paused
    budget.start()
    budget.charge(a, 10)  # now something is processed: a waits
    assert a.paused
    budget.forget(b)
    budget.finish()
    assert budget.used == 100 and not a.paused  # the oldest paused connection resumes once nothing is processed


def test_the_default_fits_the_machine():
    assert default_limit_bytes(64 * 2**20) >= 128 * 2**20
