"""Property tests of the frame decoder and the body service (issue 3 §8).

Any byte string decodes into a valid Frame or raises ProtocolError, never
another exception, and never allocates beyond the limit; mutated valid
frames (bit flips, truncation, extension, spliced headers) likewise; the
body service answers every input with a decodable frame and never raises.
"""

from __future__ import annotations

import json
import math
import struct
import tracemalloc

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splitinfer.errors import ProtocolError
from splitinfer.protocol import MAGIC, OPS, PROTOCOL_VERSION, Frame, Limits, decode_frame, encode_frame

LIMITS = Limits(max_frame_bytes=4096, max_header_bytes=1024, max_tensors=3, max_dims=4, max_list_len=64)
PREFIX = struct.Struct(">4sHI")
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(data: bytes, limits: Limits = LIMITS) -> Frame | None:
    """Decode; assert the outcome is a well-formed Frame within limits or a ProtocolError."""
    try:
        frame = decode_frame(data, limits)
    except ProtocolError as e:
        assert str(e)  # names the problem
        return None
    assert isinstance(frame, Frame) and frame.op in OPS and isinstance(frame.fields, dict)
    assert len(frame.tensors) <= limits.max_tensors
    total = 0
    for t in frame.tensors.values():
        assert isinstance(t, torch.Tensor) and t.dim() <= limits.max_dims
        total += t.numel() * t.element_size()
    assert total <= min(len(data), limits.max_frame_bytes)
    return frame


# JSON-ish values that exercise the header validation.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)
tensor_specs = st.fixed_dictionaries(
    {"name": st.one_of(st.sampled_from(["hidden", "x"]), json_values),
     "dtype": st.one_of(st.sampled_from(["float16", "float32", "bfloat16", "int64", "int32", "float64"]), json_values),
     "shape": st.one_of(st.lists(st.integers(-2, 70), max_size=5), json_values)}
)
headers = st.fixed_dictionaries(
    {"op": st.one_of(st.sampled_from(sorted(OPS)), json_values)},
    optional={"session": st.one_of(st.text(max_size=16), json_values),
              "positions": st.one_of(st.lists(st.integers(-3, 2**32), max_size=70), json_values),
              "parents": st.one_of(st.lists(st.integers(-3, 10), max_size=10), json_values),
              "protocol": st.one_of(st.integers(0, 3), json_values),
              "message": json_values,
              "tensors": st.one_of(st.lists(tensor_specs, max_size=4), json_values)},
)


@FUZZ
@given(st.binary(max_size=600))
def test_any_bytes(data):
    _check(data)


@FUZZ
@given(st.binary(max_size=300))
def test_any_bytes_after_a_valid_prefix(rest):
    _check(PREFIX.pack(MAGIC, PROTOCOL_VERSION, len(rest)) + rest)
    _check(PREFIX.pack(MAGIC, PROTOCOL_VERSION, len(rest) // 2) + rest)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(headers, st.binary(max_size=200))
def test_structured_headers(header, payload):
    try:
        h = json.dumps(header, allow_nan=True).encode()
    except (TypeError, ValueError):
        return
    _check(PREFIX.pack(MAGIC, PROTOCOL_VERSION, len(h)) + h + payload)


def _valid_frames(sid: str = "abcd", d: int = 8):
    h = torch.randn(1, 3, d)
    return [
        encode_frame("forward", {"session": sid, "positions": [0, 1, 1], "parents": [-1, 0, 0]},
                     {"hidden": h.half()}),
        encode_frame("forward", {"session": sid, "positions": [0, 1, 2]}, {"hidden": h.bfloat16()}),
        encode_frame("hello", {"protocol": PROTOCOL_VERSION, "body_sha256": "ff" * 32}),
        encode_frame("commit", {"session": sid, "keep": {"prefix": 0, "accepted": [0, 2]}}),
        encode_frame("stats"),
    ]


@FUZZ
@given(st.sampled_from(range(5)), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=6),
       st.integers(-40, 40), st.binary(max_size=40))
def test_mutated_valid_frames(which, flips, cut, extra):
    data = bytearray(_valid_frames()[which])
    assert _check(bytes(data)) is not None  # unmutated: decodes
    for pos, value in flips:
        data[pos % len(data)] = value
    if cut < 0:
        data = data[:cut]
    elif cut > 0:
        data += extra
    _check(bytes(data))


@FUZZ
@given(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=4), st.sampled_from(["float32", "int64"]))
def test_claimed_sizes_are_refused_before_allocating(shape, dtype):
    h = json.dumps({"op": "open", "tensors": [{"name": "x", "dtype": dtype, "shape": shape}]}).encode()
    data = PREFIX.pack(MAGIC, PROTOCOL_VERSION, len(h)) + h + b"\0" * 64
    tracemalloc.start()
    try:
        _check(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024  # whatever the claim (up to 2^124 bytes), nothing near it is allocated
    if math.prod(shape) * {"float32": 4, "int64": 8}[dtype] > LIMITS.max_frame_bytes:
        with pytest.raises(ProtocolError, match="over the frame limit"):
            decode_frame(data, LIMITS)


# ---------------------------------------------------------------- the service on top of the codec
@pytest.fixture(scope="module")
def service(tiny):
    from splitinfer.client import body_info
    from splitinfer.partition import CloudBody, SplitConfig
    from splitinfer.session import BodyService, ServiceLimits

    body = CloudBody.from_model(tiny.model, SplitConfig(2, 2))
    info = body_info("tiny-random", SplitConfig(2, 2), body, tiny.hidden_size, tiny.num_layers)
    return BodyService(body, info, ServiceLimits(max_sessions=8, max_context=32, frame=LIMITS))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.sampled_from(range(5)), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4),
       st.integers(-20, 20))
def test_service_answers_every_input_with_a_frame(service, which, flips, cut):
    opened = decode_frame(service.handle(encode_frame("open")))
    sid = opened.fields["session"]
    data = bytearray(_valid_frames(sid, service.info.hidden_size)[which])
    for pos, value in flips:
        data[pos % len(data)] = value
    if cut < 0:
        data = data[:cut]
    reply = decode_frame(service.handle(bytes(data)))  # never raises, always a frame
    assert reply.op in {"error", "welcome", "opened", "result", "committed", "closed", "stats_reply"}
    if reply.op == "error":
        assert not reply.fields["message"].startswith("internal server error"), reply.fields["message"]
    service.handle(encode_frame("close", {"session": sid}))
