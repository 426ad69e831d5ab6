"""Run a causal LM with the residual stream edited or read at layer boundaries (for calibrating defenses).

``boundary(model, ids, edits={a: f}, reads=(b,))`` runs the whole model once,
replacing the states after the first ``a`` decoder layers by ``f(states)``
(the head's output, as the wire would carry it) and recording the states
after the first ``b`` layers (the body's output, before the tail). Calibration
of ``shaped-noise`` (gradients at the boundary), ``denoise`` (noisy and clean
body outputs) and ``lora-adv`` (the head's states) use it; the runtime does not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

__all__ = ["boundary", "frozen"]


def _hook(edit: Callable | None, store: list | None):
    def hook(module, args, out):
        h = out[0] if isinstance(out, tuple) else out  # (B, T, d)
        if edit is not None:
            h = edit(h)
        if store is not None:
            store.append(h)
        return (h, *out[1:]) if isinstance(out, tuple) else h

    return hook


def boundary(model: torch.nn.Module, ids: torch.Tensor, edits: dict[int, Callable] | None = None,
             reads: Iterable[int] = ()) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """(B, T) ids -> ((B, T, V) logits, {b: (B, T, d) states after b layers}) with ``edits`` {a: f} applied."""
    edits = dict(edits or {})
    reads = set(reads)
    layers = model.model.layers
    stores: dict[int, list] = {b: [] for b in reads}
    handles = [layers[a - 1].register_forward_hook(_hook(edits.get(a), stores.get(a)))
               for a in sorted(set(edits) | reads) if a >= 1]
    try:
        logits = model(ids).logits  # (B, T, V)
    finally:
        for h in handles:
            h.remove()
    return logits, {b: s[-1] for b, s in stores.items() if s}


class frozen:
    """Context: the model's parameters do not require grad (gradients w.r.t. states only); restored after."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def __enter__(self) -> torch.nn.Module:
        self.saved = [(p, p.requires_grad) for p in self.model.parameters()]
        for p, _ in self.saved:
            p.requires_grad_(False)
        return self.model

    def __exit__(self, *exc) -> None:
        for p, flag in self.saved:
            p.requires_grad_(flag)
