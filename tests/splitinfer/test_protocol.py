import json
import struct

import pytest
import torch

from splitinfer.errors import ProtocolError
from splitinfer.protocol import (
    MAGIC,
    PROTOCOL_VERSION,
    Limits,
    decode_frame,
    encode_frame,
    require_finite,
    wire_dtype,
)


def raw(header: dict, payload: bytes = b"", magic=MAGIC, version=PROTOCOL_VERSION) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack(">4sHI", magic, version, len(h)) + h + payload


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32])
def test_roundtrip_dtypes(dtype):
    t = (torch.randn(1, 3, 5) * 10).to(dtype)
    f = decode_frame(encode_frame("forward", {"session": "s", "positions": [0, 1, 2]}, {"hidden": t}))
    assert f.op == "forward" and f.fields["positions"] == [0, 1, 2]
    assert f.tensors["hidden"].dtype == dtype and torch.equal(f.tensors["hidden"], t)


def test_roundtrip_empty_tensor_and_no_tensor():
    f = decode_frame(encode_frame("stats"))
    assert f.op == "stats" and f.tensors == {}
    f = decode_frame(encode_frame("result", {"session": "s"}, {"hidden": torch.zeros(1, 0, 4)}))
    assert f.tensors["hidden"].shape == (1, 0, 4)


def test_wire_dtypes():
    assert wire_dtype("fp16") == torch.float16 and wire_dtype("bf16") == torch.bfloat16
    with pytest.raises(ProtocolError, match="unknown wire dtype"):
        wire_dtype("int4")


GOOD = {"op": "forward", "session": "s", "positions": [0], "tensors": [{"name": "hidden", "dtype": "float16", "shape": [1, 1, 2]}]}


@pytest.mark.parametrize(
    "data, message",
    [
        (b"SPL", "truncated frame"),
        (raw(GOOD, b"\0" * 4, magic=b"XXXX"), "bad magic"),
        (raw(GOOD, b"\0" * 4, version=99), "unsupported protocol version 99"),
        (struct.pack(">4sHI", MAGIC, PROTOCOL_VERSION, 50) + b"{}", "truncated frame: header claims 50"),
        (struct.pack(">4sHI", MAGIC, PROTOCOL_VERSION, 3) + b"{x}", "not valid UTF-8 JSON"),
        (raw([1, 2]), "must be a JSON object"),
        (raw({"op": "launch"}), "unknown op 'launch'"),
        (raw({"op": "forward", "positions": [0]}), "lacks the field 'session'"),
        (raw({"op": "forward", "session": 5, "positions": [0]}), "must be str"),
        (raw({**GOOD, "positions": ["a"]}), "'positions' must hold integers"),
        (raw(GOOD, b"\0" * 3), "payload is 3 bytes but the tensor shapes x dtypes need 4 bytes"),
        (raw(GOOD, b"\0" * 5), "payload is 5 bytes"),
        (raw({**GOOD, "tensors": [{"name": "hidden", "dtype": "float64", "shape": [1]}]}), "unsupported dtype"),
        (raw({**GOOD, "tensors": [{"name": "hidden", "dtype": "float16", "shape": [-1]}]}), "bad shape"),
        (raw({**GOOD, "tensors": [{"name": "hidden", "dtype": "float16", "shape": [1] * 9}]}), "bad shape"),
        (raw({**GOOD, "tensors": [{"name": "h", "dtype": "float32", "shape": [2**30, 2**30]}]}), "over the frame limit"),
        (raw({**GOOD, "tensors": [{"name": "h", "dtype": "float16", "shape": [1]}] * 2}, b"\0" * 4), "duplicate"),
        (raw({**GOOD, "tensors": {"a": 1}}), "'tensors' must be a list"),
    ],
)
def test_malformed_frames_raise_protocol_error(data, message):
    with pytest.raises(ProtocolError, match=message):
        decode_frame(data)


def test_limits_checked_before_allocation():
    small = Limits(max_frame_bytes=1000, max_header_bytes=100)
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decode_frame(b"\0" * 1001, small)
    with pytest.raises(ProtocolError, match="header of"):
        decode_frame(raw({"op": "stats", "pad": "x" * 200}), small)


def test_require_finite():
    require_finite(torch.ones(3), "x")
    require_finite(torch.tensor([1, 2]), "ints are fine")
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ProtocolError, match="NaN or Inf"):
            require_finite(torch.tensor([1.0, bad]), "hidden")


def test_encode_rejects_unknown_op_and_dtype():
    with pytest.raises(ProtocolError):
        encode_frame("nope")
    with pytest.raises(ProtocolError, match="does not carry"):
        encode_frame("result", {"session": "s"}, {"hidden": torch.zeros(2, dtype=torch.float64)})
