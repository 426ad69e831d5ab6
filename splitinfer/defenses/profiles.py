"""Calibrated public parameters of a defense (per-position clips, noise shapes, denoiser weights), by digest.

Some defenses need tensors fitted on public text before they run: ``pclip``'s
per-position clips, ``shaped-noise``'s per-dimension scales, ``denoise``'s
small network. They are public (an adaptive attacker may know them) but too
long for a spec string, so a spec names them by a content digest
(``profile=3f2a...``) and the tensors live in a profile store: one safetensors
file per profile under ``$SPLITINFER_PROFILES`` (default
``~/.cache/splitinfer/profiles``), written atomically. The digest covers the
tensors and the metadata, so a label pins exactly what ran.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

import torch

from splitinfer import atomic
from splitinfer.defenses.base import DefenseError

__all__ = ["profile_dir", "save_profile", "load_profile"]


def profile_dir() -> Path:
    """Where profiles are stored: ``$SPLITINFER_PROFILES`` or ``~/.cache/splitinfer/profiles``."""
    return Path(os.environ.get("SPLITINFER_PROFILES") or Path.home() / ".cache" / "splitinfer" / "profiles")


def _digest(tensors: dict[str, torch.Tensor], meta: dict) -> str:
    h = hashlib.sha256(json.dumps(meta, sort_keys=True, default=str).encode())
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous().float()
        h.update(f"{name}:{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


def save_profile(kind: str, tensors: dict[str, torch.Tensor], meta: dict) -> str:
    """Store float32 ``tensors`` with ``meta`` (JSON) for defense ``kind``; returns the profile's key."""
    from safetensors.torch import save

    meta = {**meta, "kind": kind}
    key = _digest(tensors, meta)
    path = profile_dir() / f"{key}.safetensors"
    if not path.is_file():
        data = save({k: v.detach().cpu().contiguous().float() for k, v in tensors.items()},
                    metadata={"meta": json.dumps(meta, sort_keys=True, default=str)})
        atomic.write_bytes(path, data)
    return key


@functools.lru_cache(maxsize=32)
def _read(path: str) -> tuple[dict[str, torch.Tensor], dict]:
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        meta = json.loads((f.metadata() or {}).get("meta", "{}"))
        return {k: f.get_tensor(k) for k in f.keys()}, meta


def load_profile(key: str, kind: str) -> tuple[dict[str, torch.Tensor], dict]:
    """({name: tensor}, meta) of profile ``key``; a DefenseError naming the fix when it is missing or not ``kind``."""
    if not key:
        raise DefenseError(f"{kind}: no profile given; calibrate one on public text (docs/defenses.md, "
                           f"'Calibrated defenses') and pass {kind}.profile=KEY")
    path = profile_dir() / f"{key}.safetensors"
    if not path.is_file():
        raise DefenseError(f"{kind}: no profile {key!r} under {profile_dir()}; calibrate it again on this machine "
                           "or set SPLITINFER_PROFILES to the directory that holds it")
    tensors, meta = _read(str(path))
    if meta.get("kind") != kind:
        raise DefenseError(f"{kind}: profile {key!r} was made for {meta.get('kind')!r}, not {kind!r}")
    return tensors, meta
