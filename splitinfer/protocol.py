"""The binary frame that carries hidden states between the local side and the cloud.

Layout (all integers big-endian)::

    magic    4 bytes   b"SPLI"
    version  u16       PROTOCOL_VERSION
    hlen     u32       length of the header in bytes
    header   hlen      UTF-8 JSON object: {"op": ..., <fields>, "tensors": [{"name", "dtype", "shape"}, ...]}
    payload  rest      the tensors' raw little-endian bytes, back to back, in header order

:func:`decode_frame` checks every length, shape, dtype and limit *before* it
allocates anything, and raises :class:`ProtocolError` (never another
exception) on any malformed input. Nothing from the wire is ever eval'd,
unpickled or passed to ``torch.load``.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from dataclasses import dataclass, field

import torch

from splitinfer.errors import ProtocolError

MAGIC = b"SPLI"
PROTOCOL_VERSION = 1
_PREFIX = struct.Struct(">4sHI")  # magic, version, header length

WIRE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,  # quantised states (splitinfer.defenses.quant)
}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}

# Required header fields per operation, with their JSON types.
OPS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "hello": {"protocol": int},
    "welcome": {"protocol": int},
    "open": {},
    "opened": {"session": str},
    "forward": {"session": str, "positions": list},
    "result": {"session": str},
    "commit": {"session": str},
    "committed": {"session": str, "length": int},
    "close": {"session": str},
    "closed": {"session": str},
    "stats": {},
    "stats_reply": {},
    "error": {"message": str},
}


@dataclass(frozen=True)
class Limits:
    """Caps checked before any allocation."""

    max_frame_bytes: int = 64 * 2**20
    max_header_bytes: int = 64 * 2**10
    max_tensors: int = 4
    max_dims: int = 4
    max_list_len: int = 65536  # positions, parent arrays


DEFAULT_LIMITS = Limits()


@dataclass
class Frame:
    """A decoded message: operation, JSON fields and named tensors."""

    op: str
    fields: dict = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def _little_endian(t: torch.Tensor) -> torch.Tensor:
    if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
        raise ProtocolError("big-endian hosts are not supported")
    return t


def encode_tensors(tensors: dict[str, torch.Tensor] | None) -> tuple[list[dict], list[bytes]]:
    """Tensor specs and raw bytes for a frame: the costly half of encoding."""
    specs, blobs = [], []
    for name, t in (tensors or {}).items():
        if t.dtype not in _DTYPE_NAMES:
            raise ProtocolError(f"tensor {name!r} has dtype {t.dtype}, which the protocol does not carry")
        t = _little_endian(t.detach().to("cpu").contiguous())
        specs.append({"name": name, "dtype": _DTYPE_NAMES[t.dtype], "shape": list(t.shape)})
        blobs.append(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return specs, blobs


def encode_frame(
    op: str,
    fields: dict | None = None,
    tensors: dict[str, torch.Tensor] | None = None,
    encoded: tuple[list[dict], list[bytes]] | None = None,
) -> bytes:
    """Serialise one frame. Tensors go in their own dtype (cast beforehand for the wire).

    ``encoded`` passes the result of :func:`encode_tensors` computed earlier
    (so a caller can time that part on its own) instead of ``tensors``.
    """
    if op not in OPS:
        raise ProtocolError(f"unknown op {op!r}")
    specs, blobs = encoded if encoded is not None else encode_tensors(tensors)
    header = json.dumps({"op": op, **(fields or {}), "tensors": specs}, separators=(",", ":")).encode()
    return b"".join([_PREFIX.pack(MAGIC, PROTOCOL_VERSION, len(header)), header, *blobs])


def _check_fields(op: str, header: dict, limits: Limits) -> None:
    for name, typ in OPS[op].items():
        if name not in header:
            raise ProtocolError(f"{op!r} frame lacks the field {name!r}")
        value = header[name]
        if not isinstance(value, typ) or isinstance(value, bool):
            raise ProtocolError(f"field {name!r} of a {op!r} frame must be {typ.__name__}, got {type(value).__name__}")
    for name in ("positions", "parents"):
        value = header.get(name)
        if value is None:
            continue
        if not isinstance(value, list) or len(value) > limits.max_list_len:
            raise ProtocolError(f"field {name!r} must be a list of at most {limits.max_list_len} integers")
        if not all(isinstance(v, int) and not isinstance(v, bool) and -1 <= v < 2**31 for v in value):
            raise ProtocolError(f"field {name!r} must hold integers in [-1, 2^31)")


def _tensor_specs(header: dict, limits: Limits) -> list[tuple[str, torch.dtype, tuple[int, ...], int]]:
    specs = header.get("tensors", [])
    if not isinstance(specs, list) or len(specs) > limits.max_tensors:
        raise ProtocolError(f"'tensors' must be a list of at most {limits.max_tensors} entries")
    out = []
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict) or set(spec) != {"name", "dtype", "shape"}:
            raise ProtocolError(f"tensor spec {i} must be an object with exactly name, dtype and shape")
        name, dtype, shape = spec["name"], spec["dtype"], spec["shape"]
        if not isinstance(name, str) or not name or len(name) > 64:
            raise ProtocolError(f"tensor spec {i} has a bad name {short(name)}")
        if not isinstance(dtype, str) or dtype not in _DTYPES:
            raise ProtocolError(f"tensor {name!r} has unsupported dtype {short(dtype)}; allowed: {', '.join(_DTYPES)}")
        if (
            not isinstance(shape, list)
            or len(shape) > limits.max_dims
            or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**31 for s in shape)
        ):
            raise ProtocolError(f"tensor {name!r} has a bad shape {short(shape)} (at most {limits.max_dims} dims >= 0)")
        nbytes = math.prod(shape) * _DTYPES[dtype].itemsize
        if nbytes > limits.max_frame_bytes:
            raise ProtocolError(f"tensor {name!r} of shape {shape} would need {nbytes} bytes, over the frame limit")
        out.append((name, _DTYPES[dtype], tuple(shape), nbytes))
    if len({s[0] for s in out}) != len(out):
        raise ProtocolError("duplicate tensor names in frame")
    return out


def decode_frame(data: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS) -> Frame:
    """Parse and validate one frame; raise :class:`ProtocolError` naming the first problem."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"a frame must be bytes, got {type(data).__name__}")
    data = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    if len(data) > limits.max_frame_bytes:
        raise ProtocolError(f"frame of {len(data)} bytes exceeds the limit of {limits.max_frame_bytes} bytes")
    if len(data) < _PREFIX.size:
        raise ProtocolError(f"truncated frame: {len(data)} bytes, shorter than the {_PREFIX.size}-byte prefix")
    magic, version, hlen = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r}; expected {MAGIC!r} (not a splitinfer frame)")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {version}; this side speaks {PROTOCOL_VERSION}")
    if hlen > limits.max_header_bytes:
        raise ProtocolError(f"header of {hlen} bytes exceeds the limit of {limits.max_header_bytes}")
    if _PREFIX.size + hlen > len(data):
        raise ProtocolError(f"truncated frame: header claims {hlen} bytes, only {len(data) - _PREFIX.size} present")
    try:
        header = json.loads(bytes(data[_PREFIX.size : _PREFIX.size + hlen]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ProtocolError(f"frame header is not valid UTF-8 JSON: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError("frame header must be a JSON object")
    op = header.get("op")
    if not isinstance(op, str) or op not in OPS:  # a list or object here is unhashable: check the type first
        raise ProtocolError(f"unknown op {short(op)}; known: {', '.join(OPS)}")
    _check_fields(op, header, limits)
    specs = _tensor_specs(header, limits)
    payload = data[_PREFIX.size + hlen :]
    expected = sum(s[3] for s in specs)
    if expected != len(payload):
        raise ProtocolError(
            f"payload is {len(payload)} bytes but the tensor shapes x dtypes need {expected} bytes"
        )
    tensors, offset = {}, 0
    for name, dtype, shape, nbytes in specs:
        raw = bytearray(payload[offset : offset + nbytes])  # one bounded copy
        offset += nbytes
        t = torch.frombuffer(raw, dtype=dtype) if nbytes else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(shape)
    fields = {k: v for k, v in header.items() if k not in ("op", "tensors")}
    return Frame(op, fields, tensors)


def require_finite(t: torch.Tensor, what: str) -> None:
    """Raise ProtocolError if a floating tensor holds NaN or Inf."""
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise ProtocolError(f"{what} contains NaN or Inf values")


def wire_dtype(name: str) -> torch.dtype:
    if name not in WIRE_DTYPES:
        raise ProtocolError(f"unknown wire dtype {name!r}; choose one of {', '.join(WIRE_DTYPES)}")
    return WIRE_DTYPES[name]


MAX_ECHO_CHARS = 80  # an untrusted value quoted in an error message is cut to this many characters
MAX_ERROR_CHARS = 2000  # and a whole error message to this many


def short(value, limit: int = MAX_ECHO_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, saying how long it was: for echoing untrusted input."""
    if isinstance(value, (list, tuple)) and len(value) > 64:  # do not repr a huge list to throw it away
        value = [*value[:16], "..."]
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} chars)"


def error_frame(message: str, **fields) -> bytes:
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS] + f"... (cut from {len(message)} chars)"
    return encode_frame("error", {"message": message, **fields})
