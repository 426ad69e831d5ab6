"""Wire quantisation: codes, scales, errors and malformed frames."""

import pytest
import torch

from splitinfer.defenses import DefenseError
from splitinfer.defenses.quant import Quant, dequantize, quantize
from splitinfer.errors import ProtocolError


@pytest.mark.parametrize("fmt,bytes_per_value,tol",
                         [("int8", 1, 0.5 / 127), ("fp8", 1, 1 / 16), ("int4", 0.5, 0.5 / 7)])
def test_roundtrip_error_and_size(fmt, bytes_per_value, tol):
    x = torch.randn(1, 7, 64) * 5
    codes, scale = quantize(x, fmt, 32)
    assert codes.dtype == torch.uint8 and codes.numel() == int(7 * 64 * bytes_per_value)
    y = dequantize(codes, scale, fmt, 32)
    if fmt == "int4":  # per group of 32
        amax = x.reshape(1, 7, 2, 32).abs().amax(-1).repeat_interleave(32, -1)
    else:
        amax = x.abs().amax(-1, keepdim=True)
    assert bool(((y - x).abs() <= tol * amax + 1e-6).all())


def test_int8_hand_values():
    codes, scale = quantize(torch.tensor([[1.27, -0.5, 0.0, 0.004]]), "int8", 32)
    assert codes.view(torch.int8).tolist() == [[127, -50, 0, 0]]
    assert float(scale) == pytest.approx(0.01)


def test_zero_rows_and_decode_checks():
    q = Quant(format="int4", group=4)
    x = torch.zeros(1, 2, 8)
    assert torch.equal(q.decode(q.encode(x), 8), x)
    with pytest.raises(ProtocolError, match="expected quantised states"):
        q.decode({"hidden": x}, 8)
    enc = q.encode(torch.randn(1, 2, 8))
    with pytest.raises(ProtocolError, match="expected"):
        q.decode({"hidden_q": enc["hidden_q"][..., :3], "hidden_scale": enc["hidden_scale"]}, 8)
    with pytest.raises(ProtocolError, match="finite"):
        q.decode({"hidden_q": enc["hidden_q"], "hidden_scale": torch.full_like(enc["hidden_scale"], float("nan"))}, 8)
    with pytest.raises(DefenseError, match="multiple of group"):
        Quant(format="int4", group=32).encode(torch.zeros(1, 1, 48))
