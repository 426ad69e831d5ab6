import pytest

from splitinfer.errors import SplitInferError
from splitinfer.link import Link, WanProfile


class EchoLink(Link):
    def _exchange(self, frame: bytes) -> bytes:
        return frame + b"!"


def test_bytes_and_round_trips_are_counted():
    link = EchoLink()
    link.request(b"abc")
    link.request(b"de")
    s = link.stats
    assert (s.round_trips, s.bytes_sent, s.bytes_received) == (2, 5, 7)
    assert s.history[0][:2] == (3, 4)


def test_emulated_delay_rtt_bandwidth_and_seeded_jitter():
    link = EchoLink(WanProfile(rtt_ms=20, bandwidth_mbps=8))
    # 1000 bytes at 8 Mbit/s = 1 ms, plus 20 ms RTT
    assert link.emulated_delay_s(600, 400) == pytest.approx(0.021)
    a = EchoLink(WanProfile(rtt_ms=20, jitter_ms=5, seed=1))
    b = EchoLink(WanProfile(rtt_ms=20, jitter_ms=5, seed=1))
    da = [a.emulated_delay_s(0, 0) for _ in range(50)]
    assert da == [b.emulated_delay_s(0, 0) for _ in range(50)]
    assert len(set(da)) > 1 and min(da) >= 0


def test_request_sleeps_the_emulated_time():
    link = EchoLink(WanProfile(rtt_ms=5))
    link.request(b"x")
    assert link.stats.emulated_s == pytest.approx(0.005)
    assert link.stats.wall_s >= 0.005


@pytest.mark.parametrize("kwargs", [{"rtt_ms": -1}, {"bandwidth_mbps": 0}, {"jitter_ms": -2}])
def test_bad_wan_profile(kwargs):
    with pytest.raises(SplitInferError):
        WanProfile(**kwargs)


@pytest.mark.parametrize("kwargs", [{"rtt_ms": float("nan")}, {"rtt_ms": float("inf")}, {"rtt_ms": -1},
                                    {"bandwidth_mbps": float("nan")}, {"bandwidth_mbps": float("inf")},
                                    {"bandwidth_mbps": 0}, {"jitter_ms": float("nan")}, {"jitter_ms": float("inf")}])
def test_a_link_profile_refuses_nan_and_infinite_values(kwargs):
    with pytest.raises(SplitInferError, match="must be a finite number"):
        WanProfile(**kwargs)
