"""The bridge: a closed-form ridge map standing in for the cloud body, fitted from the client's own traffic.

Every step the client sends the head's output ``x`` (d,) for each position
and receives the body's output ``y`` (d,). :class:`RidgeBridge` fits, in the
residual form

    y ~ x + [x, 1] @ W,        W: (d + 1, d),

by ridge regression on those pairs: it keeps the sufficient statistics
``G = A^T A`` and ``C = A^T (Y - X)`` (``A = [X, 1]``, float64), so adding
pairs is a rank update and a refit is one (d + 1)-square solve. The penalty
is per feature, ``ridge * G[j, j] / n`` (ridge on standardised features,
``ridge`` in units of samples; the bias is not penalised): with few pairs
the map shrinks towards the identity (skip the body: Draft & Verify's layer
skipping), with many it approaches the least-squares map. No body weights
are needed, only states the client sees anyway.

A calibration file warm-starts the statistics: :func:`calibrate` runs
token sequences through the real split once (one cloud session each) and
:meth:`RidgeBridge.save` writes ``G``, ``C`` as safetensors plus a JSON
description (model, split, pairs); never pickle.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from splitinfer.atomic import check_made_for
from splitinfer.errors import SplitInferError
from splitinfer.tokens import encode_text

log = logging.getLogger(__name__)

FORMAT = "splitinfer-bridge"
VERSION = 1


class RidgeBridge:
    """Residual ridge map (n, d) -> (n, d) from head output to body output, refitted on demand."""

    def __init__(self, dim: int, ridge: float = 30.0):
        if not ridge > 0:
            raise SplitInferError(f"bridge ridge must be > 0 (a penalty in samples, e.g. 30), got {ridge!r}")
        self.dim, self.ridge = int(dim), float(ridge)
        self.G = torch.zeros(dim + 1, dim + 1, dtype=torch.float64)  # A^T A, A = [X, 1]
        self.C = torch.zeros(dim + 1, dim, dtype=torch.float64)  # A^T (Y - X)
        self.n = 0  # pairs seen
        self.W: torch.Tensor | None = None  # (d + 1, d) float32; None = identity map

    def observe(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Add pairs: x, y (n, d) sent / received states."""
        if x.shape != y.shape or x.dim() != 2 or x.shape[1] != self.dim:
            raise SplitInferError(f"bridge pairs must both be (n, {self.dim}); got {tuple(x.shape)}, {tuple(y.shape)}")
        x64, y64 = x.detach().to("cpu", torch.float64), y.detach().to("cpu", torch.float64)
        a = torch.cat([x64, torch.ones(len(x64), 1, dtype=torch.float64)], 1)  # (n, d + 1)
        self.G += a.T @ a
        self.C += a.T @ (y64 - x64)
        self.n += len(x64)

    def fit(self) -> None:
        """Solve for W from the statistics so far (no-op without pairs)."""
        if self.n == 0:
            self.W = None
            return
        lam = self.ridge * torch.diagonal(self.G).clamp_min(1e-12) / self.n  # (d + 1,)
        lam[-1] = 0.0  # the bias is not penalised
        self.W = torch.linalg.solve(self.G + torch.diag(lam), self.C).float()  # (d + 1, d)

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., d) -> estimated body output (..., d), same dtype and device."""
        if self.W is None:
            return x
        w = self.W.to(x.device)
        return (x.float() + x.float() @ w[:-1] + w[-1]).to(x.dtype)

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path, meta: dict, force: bool = False) -> Path:
        """Write ``PATH.safetensors`` (G, C) and ``PATH.json`` (``meta`` + dim, ridge, pairs), atomically, JSON last.

        A calibration of a different run (another model, split, corpora, wire dtype or
        ridge) at ``PATH`` is not overwritten unless ``force``.
        """
        from safetensors.torch import save_file

        from splitinfer.atomic import atomic_file, guard_overwrite, write_json

        base = _base(path)
        run = {**{k: meta.get(k) for k in RUN_KEYS}, "hidden_size": self.dim, "ridge": self.ridge}
        guard_overwrite(base.with_suffix(".json"), run, "run", force, "a bridge calibration")
        info = {"format": FORMAT, "version": VERSION, **meta, "hidden_size": self.dim, "ridge": self.ridge,
                "pairs": self.n, "run": run}
        base.with_suffix(".json").unlink(missing_ok=True)  # until the new JSON lands, there is no calibration
        with atomic_file(base.with_suffix(".safetensors")) as tmp:
            save_file({"G": self.G.contiguous(), "C": self.C.contiguous()}, str(tmp))
        write_json(base.with_suffix(".json"), info, indent=1, sort_keys=True)
        return base.with_suffix(".json")

    @classmethod
    def load(cls, path: str | Path, expect: dict | None = None, ridge: float | None = None) -> RidgeBridge:
        """Read a calibration written by :meth:`save`; ``expect`` entries (split, model...) must match."""
        from safetensors.torch import load_file

        base = _base(path)
        js, st = base.with_suffix(".json"), base.with_suffix(".safetensors")
        if not js.exists() or not st.exists():
            raise SplitInferError(f"no bridge calibration at {base}: expected {js.name} and {st.name} "
                                  "(write one with `splitinfer draft-calibrate --out PATH`)")
        try:
            info = json.loads(js.read_text())
        except (OSError, ValueError) as e:
            raise SplitInferError(f"{js} is not readable JSON ({type(e).__name__}); recalibrate") from None
        check_made_for(info, js, FORMAT, VERSION, expect, "bridge calibration", "recalibrate for this model and split")
        try:
            tensors = load_file(str(st))
        except Exception as e:  # safetensors raises several types on corrupt files
            raise SplitInferError(f"{st} is not a readable safetensors file ({type(e).__name__}); recalibrate with "
                                  "`splitinfer draft-calibrate --force`") from None
        d = int(info["hidden_size"])
        if tuple(tensors["G"].shape) != (d + 1, d + 1) or tuple(tensors["C"].shape) != (d + 1, d):
            raise SplitInferError(f"bridge calibration {st} has tensors of the wrong shape for hidden size {d}")
        bridge = cls(d, ridge if ridge is not None else float(info.get("ridge", 30.0)))
        bridge.G, bridge.C, bridge.n = tensors["G"].double(), tensors["C"].double(), int(info["pairs"])
        bridge.fit()
        return bridge


RUN_KEYS = ("model_sha256", "split", "num_layers", "corpora", "wire_dtype")  # with hidden_size, ridge: the run


def _base(path: str | Path) -> Path:
    p = Path(path)
    return p.with_suffix("") if p.suffix in (".json", ".safetensors") else p


def split_meta(sm) -> dict:
    """What a calibration must match: the model weights and the split."""
    return {"model_sha256": sm.loaded.sha256 or "", "split": str(sm.split), "num_layers": sm.loaded.num_layers}


def corpus_sequences(tokenizer, corpora: Sequence[str], max_tokens: int, seq_len: int = 256) -> list[list[int]]:
    """Token sequences (<= ``seq_len``) from the train split of registered corpora (:mod:`splitinfer.corpora`),
    about ``max_tokens`` in all, shared evenly between the corpora."""
    from splitinfer.corpora import load_corpus

    if max_tokens < 1 or seq_len < 2 or not corpora:
        raise SplitInferError("bridge calibration needs corpora, max_tokens >= 1 and seq_len >= 2")
    out: list[list[int]] = []
    for name in corpora:
        budget = max_tokens // len(corpora)
        for text in load_corpus(name, "train", tokenizer=tokenizer)["text"]:
            ids = encode_text(tokenizer, text).ids[:seq_len]
            if len(ids) >= 2:
                out.append(ids[:budget])
                budget -= len(out[-1])
            if budget <= 0:
                break
    return out


def calibrate(sm, sequences: Iterable[Sequence[int]], ridge: float = 30.0, progress: bool = True) -> RidgeBridge:
    """Statistics of (sent, received) states for each token sequence, run through the real split once.

    Each sequence is one prefill in a fresh cloud session (``sm`` is a
    :class:`~splitinfer.client.SplitModel`); nothing but the states the
    client sees is used.
    """
    from tqdm import tqdm

    bridge = RidgeBridge(sm.loaded.hidden_size, ridge)
    seqs = [list(s) for s in sequences if len(s)]
    if not seqs:
        raise SplitInferError("bridge calibration needs at least one non-empty token sequence")
    for ids in tqdm(seqs, desc="calibrating bridge", disable=not progress, leave=False):
        if sm.max_context:
            ids = ids[: sm.max_context]
        sm.remote.open()
        try:
            _, _, (sent, received, _) = sm.forward_step(sm.head.new_cache(), sm.tail.new_cache(), ids,
                                                     list(range(len(ids))), return_states=True)
        finally:
            sm.remote.close()
        bridge.observe(sent, received)
    bridge.fit()
    log.info("bridge calibrated on %d pairs from %d sequences", bridge.n, len(seqs))
    return bridge
