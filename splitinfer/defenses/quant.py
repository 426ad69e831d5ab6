"""``quant``: quantised hidden states on the wire, both directions.

Formats (the strength axis, coarsest last):

- ``int8``: per-token absmax (LLM.int8's vector-wise quantisation without the
  outlier split: Dettmers et al., NeurIPS 2022): ``q = round(x / s)``,
  ``s = max|x| / 127``, one float32 scale per token.
- ``int4``: group-wise absmax over ``group`` consecutive coordinates (the
  group-wise scheme of GPTQ/AWQ-style weight quantisers applied to
  activations), codes in [-7, 7] packed two per byte, one float32 scale per
  group.
- ``fp8``: ``torch.float8_e4m3fn`` (Micikevicius et al., "FP8 formats for deep
  learning", 2022) after a per-token scale ``max|x| / 448``, one byte per value.

The frame carries the codes (``hidden_q``, uint8) and the scales
(``hidden_scale``, float32) instead of ``hidden``, so the bytes per step really
fall; the receiver dequantises to float32, and the cloud's body runs on
exactly the dequantised values (:func:`roundtrip` computes them locally).
``replies=false`` leaves the body's replies unquantised (float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from splitinfer.defenses.base import Defense, DefenseError, register_defense
from splitinfer.errors import ProtocolError

FORMATS = {"int8": 8, "fp8": 8, "int4": 4}
_FP8_MAX = 448.0


def quantize(x: torch.Tensor, fmt: str, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., d) float -> codes (..., d or d/2) uint8, scales (..., G) float32."""
    x = x.float()
    if fmt == "int4":
        g = x.reshape(*x.shape[:-1], -1, group)  # (..., G, group)
        scale = g.abs().amax(-1) / 7.0  # (..., G)
        q = torch.round(g / torch.where(scale > 0, scale, 1.0)[..., None]).clamp(-7, 7).to(torch.int16) + 8
        q = q.reshape(*x.shape).to(torch.uint8)  # (..., d) in [1, 15]
        return q[..., 0::2] | (q[..., 1::2] << 4), scale
    amax = x.abs().amax(-1, keepdim=True)  # (..., 1)
    if fmt == "int8":
        scale = amax / 127.0
        q = torch.round(x / torch.where(scale > 0, scale, 1.0)).clamp(-127, 127).to(torch.int8)
        return q.view(torch.uint8), scale
    scale = amax / _FP8_MAX
    q = (x / torch.where(scale > 0, scale, 1.0)).to(torch.float8_e4m3fn)
    return q.view(torch.uint8), scale


def dequantize(codes: torch.Tensor, scale: torch.Tensor, fmt: str, group: int) -> torch.Tensor:
    """Inverse of :func:`quantize`: (..., d) float32."""
    if fmt == "int4":
        lo, hi = (codes & 0xF).to(torch.int16) - 8, (codes >> 4).to(torch.int16) - 8
        q = torch.stack([lo, hi], dim=-1).reshape(*codes.shape[:-1], -1).float()  # (..., d)
        g = q.reshape(*q.shape[:-1], -1, group) * scale[..., None]
        return g.reshape(q.shape)
    if fmt == "int8":
        return codes.view(torch.int8).float() * scale
    return codes.view(torch.float8_e4m3fn).float() * scale


@register_defense("quant")
@dataclass(frozen=True)
class Quant(Defense):
    """Quantise the states on the wire (``format``: int8 | fp8 | int4; ``group`` for int4)."""

    format: str = "int8"
    group: int = 32
    replies: bool = True

    kind = "wire"
    strength = ("format",)

    def validate(self) -> None:
        if self.format not in FORMATS:
            raise DefenseError(f"quant: format={self.format!r} is unknown; choose one of {', '.join(FORMATS)}, "
                               "e.g. --defense-option quant.format=int8")
        if self.group < 2 or self.group % 2:
            raise DefenseError(f"quant: group={self.group} must be an even number >= 2; e.g. quant.group=32")

    @property
    def cloud_must_know(self) -> bool:
        return True

    @property
    def bits(self) -> int:
        return FORMATS[self.format]

    def check_width(self, d: int) -> None:
        if self.format == "int4" and d % self.group:
            raise DefenseError(f"quant: int4 needs the hidden size {d} to be a multiple of group={self.group}; "
                               "pick a group that divides it, e.g. --defense-option quant.group=16")

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """(1, T, d) -> the frame's tensors."""
        self.check_width(x.shape[-1])
        codes, scale = quantize(x, self.format, self.group)
        return {"hidden_q": codes, "hidden_scale": scale}

    def decode(self, tensors: dict[str, torch.Tensor], d: int) -> torch.Tensor:
        """The frame's tensors -> (1, T, d) float32; ProtocolError on anything malformed."""
        codes, scale = tensors.get("hidden_q"), tensors.get("hidden_scale")
        if codes is None or scale is None or set(tensors) != {"hidden_q", "hidden_scale"}:
            raise ProtocolError(f"expected quantised states (hidden_q, hidden_scale) for {self.label()}, got "
                                f"{sorted(tensors)}; start client and server with the same --defense")
        width = d // 2 if self.format == "int4" else d
        groups = d // self.group if self.format == "int4" else 1
        if (codes.dtype != torch.uint8 or scale.dtype != torch.float32 or codes.dim() != 3
                or codes.shape[-1] != width or list(scale.shape) != [*codes.shape[:-1], groups]):
            raise ProtocolError(f"quantised states have shapes {list(codes.shape)}/{list(scale.shape)} and dtypes "
                                f"{codes.dtype}/{scale.dtype}; expected [1, T, {width}] uint8 / [1, T, {groups}] "
                                "float32")
        if not bool(torch.isfinite(scale).all()) or bool((scale < 0).any()):
            raise ProtocolError("quantisation scales must be finite and >= 0")
        if self.format == "int8" and bool((codes.view(torch.int8) == -128).any()):
            raise ProtocolError("int8 codes must lie in [-127, 127]")
        out = dequantize(codes, scale, self.format, self.group)
        if not bool(torch.isfinite(out).all()):
            raise ProtocolError("dequantised states contain NaN or Inf values")
        return out

    def roundtrip(self, x: torch.Tensor) -> torch.Tensor:
        """What the receiver sees for x (..., d): dequantize(quantize(x)), float32."""
        self.check_width(x.shape[-1])
        return dequantize(*quantize(x, self.format, self.group), self.format, self.group)
