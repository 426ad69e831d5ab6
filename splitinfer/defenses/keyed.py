"""Counter-based Gaussian draws: the noise at a position depends on its key alone, not on call order.

Each value is a pure function of (seed, session, absolute position,
direction, element index): a 64-bit key per position is mixed with the
element counter by the SplitMix64 finaliser (Steele, Lea and Flood, "Fast
splittable pseudorandom number generators", OOPSLA 2014), the top 53 bits make
two uniforms and Box-Muller turns them into a standard normal. The same
scheme as counter-based generators such as Philox (Salmon et al., "Parallel
random numbers: as easy as 1, 2, 3", SC 2011), so a speculative step that
sends positions 7..12 at once sees exactly the noise a sequential run sent one
position at a time. Deviation: SplitMix64 is not a cryptographic PRF; a noise
seed is a secret only as far as the attacker cannot brute-force 64 bits.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import torch

_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_GOLDEN = 0x9E3779B97F4A7C15
DIRECTIONS = {"up": 1, "down": 2}


def _signed(x: int) -> int:
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finaliser on int64 tensors (wrapping multiplication)."""
    z = (z ^ _shr(z, 30)) * _signed(_M1)
    z = (z ^ _shr(z, 27)) * _signed(_M2)
    return z ^ _shr(z, 31)


def position_keys(seed: int, session: int, positions: Sequence[int], direction: str) -> torch.Tensor:
    """(T,) int64 keys, one per absolute position."""
    base = hashlib.blake2b(f"{seed}/{session}/{DIRECTIONS[direction]}".encode(), digest_size=8).digest()
    k0 = _signed(int.from_bytes(base, "little"))
    pos = torch.as_tensor(list(positions), dtype=torch.int64)  # (T,)
    return _mix(pos * _signed(_GOLDEN) + k0)


def _mix_int(z: int) -> int:
    z &= (1 << 64) - 1
    z = ((z ^ (z >> 30)) * _M1) & ((1 << 64) - 1)
    z = ((z ^ (z >> 27)) * _M2) & ((1 << 64) - 1)
    return z ^ (z >> 31)


def path_digests(parent: int, tokens: Sequence[int], parents: Sequence[int] | None = None) -> list[int]:
    """Digest of the token path ending at each row: chain rows (``parents`` None) or a tree's parent array.

    ``parent`` is the digest of the committed prefix (0 for an empty one). Two rows get the same digest
    only for the same tokens at the same positions, i.e. the same state.
    """
    out: list[int] = []
    for i, tok in enumerate(tokens):
        p = (i - 1) if parents is None else parents[i]
        out.append(_mix_int((parent if p < 0 else out[p]) * _GOLDEN + int(tok) + 1))
    return out


def keyed_normal(seed: int, session: int, positions: Sequence[int], direction: str, d: int,
                 content: Sequence[int] | None = None) -> torch.Tensor:
    """(T, d) float32 standard normals keyed by (seed, session, position, direction[, path digest], element)."""
    keys = position_keys(seed, session, positions, direction)  # (T,)
    if content is not None:
        keys = _mix(keys ^ torch.tensor([_signed(c) for c in content], dtype=torch.int64))
    half = (d + 1) // 2
    ctr = torch.arange(2 * half, dtype=torch.int64) * _signed(_GOLDEN)  # (2h,)
    bits = _mix(keys[:, None] + ctr[None, :])  # (T, 2h)
    u = (_shr(bits, 11).double() + 0.5) / float(1 << 53)  # (T, 2h) in (0, 1)
    u1, u2 = u[:, :half], u[:, half:]
    r = torch.sqrt(-2.0 * torch.log(u1))
    z = torch.cat([r * torch.cos(2 * math.pi * u2), r * torch.sin(2 * math.pi * u2)], dim=1)  # (T, 2h)
    return z[:, :d].float()


def draw_session(name: str, per_session: bool, session: int, content: Sequence[int] | None) -> int:
    """The session a defense's draws are keyed by. ``per_session`` (the default): the session's own, so text
    resent in a new session gets fresh draws, which an observer can average away (noise std / sqrt(r) over r
    sessions; ``reports/resend``). Off: one key for every session, so the same token path at the same position
    gets the same draw again and a resend releases nothing new; the path digest (``content``) still keeps
    different texts' draws apart, so it is required."""
    if per_session:
        return session
    if content is None:
        from splitinfer.defenses.base import DefenseError

        raise DefenseError(f"{name}: per_session=false keys its draws by the token path, which this caller did "
                           f"not pass; release through SplitModel / DefensePipeline.transform_up, or keep per_session")
    return 0
