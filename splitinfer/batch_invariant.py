"""Batch-invariant kernels: every token's logits independent of how many tokens share its forward.

Speculative verification runs the next position and a whole draft in ONE
forward; sequential decoding runs one token per forward. With stock float32
kernels the two give slightly different logits for the same token (up to
~1.3e-4 on the default model, measured as the ``float32 floor`` of ``bench
decoding``) because a matrix product's reduction order depends on how many
rows it has, and attention over a tree mask reduces over a different key
layout than attention over a plain cache. The tokens agree; the last bits do
not.

This module removes both sources, following the idea of batch-invariant
kernels (He and Thinking Machines Lab, "Defeating Nondeterminism in LLM
Inference", 2025), with off-the-shelf kernels instead of new ones:

- **Linear layers** (each module's ``forward`` replaced, parameter names unchanged):
  the rows are zero-padded to a multiple of ``m`` before the product and
  cropped after. ``m`` is chosen per weight shape by :func:`probe_linear`,
  which checks *on this machine* that each row's result is bitwise the same
  for any row count and offset; when no padding passes, every row is
  multiplied on its own (always invariant, slower).
- **Attention** (registered with transformers as
  ``splitinfer_batch_invariant``): each query row attends alone (q_len 1)
  to exactly the keys its mask allows, gathered into a contiguous block in
  cache order. A verified tree node at depth ``d`` then sees the same keys,
  in the same order and the same shapes, as sequential decoding at that
  position, so the kernel computes the same float32 sums.

Everything else in a decoder layer is per-row or elementwise. The cost: a
1-token step multiplies ``m`` rows instead of one (sequential decoding about 1.8x slower on a CPU),
and attention is one call per query row. It is opt-in (``--batch-invariant``)
for exactness checks; the default kernels are faster and agree to the float32
floor. Deviation from the paper: we pick padding empirically instead of
writing fixed-split-size kernels, so the guarantee is the probe's, on this
machine, for the row counts it checks (every padded height up to
:data:`MAX_ROWS`; larger forwards, i.e. long prompts, are prefills that both
decoding paths run alike). ``enable`` probes again after a move to another
device or dtype (call it again after moving the model). The kernels
are invariant to the batch, not to the machine: a process with another thread
count or CPU may round differently, so compare speculative and sequential
decoding through the same processes (a cloud body must run them too: the
hello refuses a client with them and a server without).
"""

from __future__ import annotations

from types import MethodType

import torch
import torch.nn.functional as F
from torch import nn

from splitinfer.errors import SplitInferError

ATTENTION_NAME = "splitinfer_batch_invariant"
PAD_CHOICES = (8, 16, 32, 64)
ROWS = 0  # "multiple" meaning: multiply every row on its own
MAX_ROWS = 136  # the probe checks every padded height up to here: verify forwards carry at most 65 rows


def _padded_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, multiple: int) -> torch.Tensor:
    """x: (M, K) -> (M, N); rows padded to a multiple of ``multiple`` (0: one product per row)."""
    m = x.shape[0]
    if multiple == ROWS:
        return torch.cat([F.linear(x[i : i + 1].clone(), weight, bias) for i in range(m)]) if m else \
            F.linear(x, weight, bias)
    pad = -m % multiple if m else multiple
    if pad:
        x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
    return F.linear(x, weight, bias)[:m]


@torch.no_grad()
def _is_row_invariant(weight: torch.Tensor, bias: torch.Tensor | None, multiple: int, seed: int = 0) -> bool:
    """True when every row's product is bitwise the same as alone, at every padded height up to MAX_ROWS.

    Each height k*m (k = 1, 2, ...) is checked full and with m - 1 rows of padding, at offsets 0 and 1
    (row 0 of one call is another row of the next).
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(MAX_ROWS + 1, weight.shape[1], generator=gen).to(weight.device, weight.dtype)  # (R+1, K)
    alone = torch.cat([_padded_linear(x[i : i + 1], weight, bias, multiple) for i in range(x.shape[0])])
    for height in range(multiple, MAX_ROWS + 1, multiple):
        for rows in sorted({height, height - multiple + 1}):
            for start in (0, 1):
                got = _padded_linear(x[start : start + rows], weight, bias, multiple)
                if not torch.equal(got, alone[start : start + rows]):
                    return False
    return True


def probe_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> int:
    """The smallest padding multiple in :data:`PAD_CHOICES` that is row-invariant here, else :data:`ROWS`."""
    for multiple in PAD_CHOICES:
        if _is_row_invariant(weight, bias, multiple):
            return multiple
    return ROWS


def _linear_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """Replaces ``nn.Linear.forward`` on one module: (..., K) -> (..., N) through :func:`_padded_linear`."""
    flat = x.reshape(-1, x.shape[-1])  # (M, K)
    return _padded_linear(flat, self.weight, self.bias, self._bi_multiple).reshape(*x.shape[:-1], self.out_features)


def batch_invariant_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                              scaling: float | None = None, **kwargs):
    """Attention one query row at a time over the keys its mask allows, gathered contiguously.

    query: (B, H, T, D); key/value: (B, H_kv, S, D|Dv) with the new tokens last;
    attention_mask: bool (B|1, 1, T, S) True = may attend, an additive float
    mask of 0 / large negative entries, or None, which means what it means to
    transformers' sdpa: every key for one query row or a non-causal module,
    else causal from the first key (sdpa then crops the keys to the first T).
    Returns ((B, T, H, Dv), None) like transformers' sdpa attention.
    """
    if kwargs.get("softcap") is not None:
        raise SplitInferError("batch-invariant attention does not support attention logit soft-capping")
    for name in ("s_aux", "sinks", "position_bias"):
        if kwargs.get(name) is not None:
            raise SplitInferError(f"batch-invariant attention does not support {name}")
    if dropout:
        raise SplitInferError("batch-invariant attention is for inference: dropout must be 0")
    b, h, t, _ = query.shape
    s = key.shape[2]
    if h % key.shape[1]:
        raise SplitInferError(f"batch-invariant attention: {h} query heads do not share {key.shape[1]} key heads")
    gqa = {"enable_gqa": True} if h != key.shape[1] else {}  # keys stay (B, H_kv, S, D): no copy per group
    allowed = _allowed(module, attention_mask, t, s, kwargs.get("is_causal"))  # (B|1, 1, T, S)
    out = query.new_empty(b, t, h, value.shape[-1])  # (B, T, H, Dv)
    for bi in range(b):
        rows = allowed[bi if allowed.shape[0] > 1 else 0, 0]  # (T, S)
        for i in range(t):
            idx = rows[i].nonzero().squeeze(1).to(key.device)  # (n_i,)
            k = key[bi : bi + 1].index_select(2, idx)  # (1, H_kv, n_i, D) contiguous
            v = value[bi : bi + 1].index_select(2, idx)
            q = query[bi : bi + 1, :, i : i + 1].contiguous()  # (1, H, 1, D)
            out[bi, i] = F.scaled_dot_product_attention(q, k, v, scale=scaling, **gqa)[0, :, 0]
    return out, None


def _allowed(module, mask: torch.Tensor | None, t: int, s: int, is_causal: bool | None) -> torch.Tensor:
    """Which keys each query row may see: bool (B|1, 1, T, S) on the CPU (see batch_invariant_attention)."""
    if mask is None:
        causal = getattr(module, "is_causal", True) if is_causal is None else bool(is_causal)
        full = torch.ones(t, s, dtype=torch.bool)
        return (full if t == 1 or not causal else full.tril(0))[None, None]
    if mask.dim() != 4 or mask.shape[-2:] != (t, s):
        raise SplitInferError(f"batch-invariant attention got a mask of shape {list(mask.shape)} for {t} queries "
                              f"and {s} keys")
    if mask.shape[1] != 1:
        raise SplitInferError("batch-invariant attention needs a mask shared by all heads")
    if mask.dtype == torch.bool:
        return mask.cpu()
    blocked = mask <= torch.finfo(mask.dtype).min / 2
    if bool((mask[~blocked] != 0).any()):
        raise SplitInferError("batch-invariant attention takes masks, not additive attention biases")
    return (~blocked).cpu()


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, batch_invariant_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


def enable(module: nn.Module, config=None) -> dict[str, int]:
    """Switch ``module`` (a model or one of its parts) to batch-invariant kernels, in place; idempotent.

    ``config``: the transformers config its attention layers read (default:
    ``module.config``). Returns ``{"OUTxIN": padding multiple}`` per linear
    weight shape (0 = row by row), for the run's record.
    """
    config = config if config is not None else getattr(module, "config", None)
    if config is None:
        raise SplitInferError(f"cannot make a {type(module).__name__} batch-invariant: it has no model config")
    _register()
    config._attn_implementation = ATTENTION_NAME
    chosen: dict[tuple, int] = {}
    for lin in module.modules():
        if not isinstance(lin, nn.Linear):
            continue
        k = _key(lin)
        if getattr(lin, "_bi_key", None) == k:  # probed for this shape, dtype and device already
            chosen.setdefault(k, lin._bi_multiple)
            continue
        if k not in chosen:  # new, or moved to another device / dtype since: probe again
            chosen[k] = probe_linear(lin.weight, lin.bias)
        lin._bi_multiple, lin._bi_key = chosen[k], k
        lin.forward = MethodType(_linear_forward, lin)  # instance attribute: parameter names unchanged
    return padding(module)


def padding(module: nn.Module) -> dict[str, int]:
    """``{"OUTxIN[+bias] dtype device": padding multiple}`` of ``module``'s batch-invariant linears (0 = per row)."""
    return {f"{k[0]}x{k[1]}{'+bias' if k[2] else ''} {str(k[3]).removeprefix('torch.')} {k[4]}": m._bi_multiple
            for m in module.modules() if isinstance(m, nn.Linear) and (k := getattr(m, "_bi_key", None))}


def _key(lin: nn.Linear) -> tuple:
    return (lin.out_features, lin.in_features, lin.bias is not None, lin.weight.dtype, str(lin.weight.device))


def is_enabled(module: nn.Module) -> bool:
    """True when ``module``'s attention and every linear layer in it run batch-invariant kernels."""
    config = getattr(module, "config", None)
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    return (getattr(config, "_attn_implementation", None) == ATTENTION_NAME
            and all(getattr(m, "_bi_key", None) == _key(m) for m in linears))


def kernels(module: nn.Module) -> str:
    """The name results record for ``module``'s kernels: 'batch-invariant' or 'default'."""
    return "batch-invariant" if is_enabled(module) else "default"
