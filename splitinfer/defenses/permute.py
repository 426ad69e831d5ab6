"""``permute``: a secret orthogonal change of basis of the hidden dimension, with matching body weights.

The PermLLM / STIP family of defenses (Zheng et al., "PermLLM: Private
Inference of Large Language Models within 3 Seconds under WAN", 2024; Yuan et
al., "STIP: Secure Three-Party Transformer Inference Protocol", 2024): the
user keeps a secret orthogonal matrix Q (d, d), sends ``h Q`` instead of the
head's states ``h`` and hands the cloud body weights transformed so that the
body computes exactly the same function in the new basis; the reply ``y Q`` is
turned back (``y Q^T``) on the local side before the tail. With Q orthogonal
the residual stream's RMS norms do not change, so per decoder layer:

- each RMSNorm's gain is folded into the linear maps it feeds (q, k, v after
  ``input_layernorm``; gate, up after ``post_attention_layernorm``) and set to 1
  (the folding of SliceGPT, Ashkboos et al., ICLR 2024, and QuaRot);
- maps that read the residual stream take ``W Q`` (W: (out, in)),
- maps that write it (o, down) take ``Q^T W`` and their bias ``b Q``.

``mode``: ``signed`` (a signed permutation: what the permutation papers use) or
``rotation`` (Haar-random orthogonal). Q is drawn from ``seed`` alone, the same
for every session (the cloud's weights are fixed per deployment); the seed is
the secret. The head and tail are unchanged, so utility is the undefended
model's up to float rounding (measured in the defenses stage).

The cloud holds ``W Q`` and the public W, so it can solve for Q (orthogonal
Procrustes): ``vocab-match-adaptive`` does exactly that before matching
(:mod:`attacks.recipes.vocab_match_adaptive`). Deviations from the papers: no
secret sharing or MPC (the body runs in the clear on transformed weights, the
setting of the permutation-only variants); Llama-style decoder layers only.
Handing transformed weights to a served body is not implemented: the in-process
body of :class:`~splitinfer.client.SplitModel` and the attack harness use it.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from splitinfer.defenses.base import Defense, DefenseError, register_defense

MODES = ("signed", "rotation")
_NORM_FEEDS = (("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
               ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj")))
_WRITERS = ("self_attn.o_proj", "mlp.down_proj")
READERS = tuple(name for _, names in _NORM_FEEDS for name in names)  # maps that read the residual stream


@functools.lru_cache(maxsize=8)
def basis(mode: str, seed: int, d: int) -> torch.Tensor:
    """The secret (d, d) float64 orthogonal matrix Q of (mode, seed); states are released as ``h Q``."""
    gen = torch.Generator().manual_seed(int(seed))
    if mode == "signed":
        perm = torch.randperm(d, generator=gen)
        signs = torch.randint(0, 2, (d,), generator=gen, dtype=torch.float64) * 2 - 1
        q = torch.zeros(d, d, dtype=torch.float64)
        q[perm, torch.arange(d)] = signs  # (h Q)_i = sign_i * h_perm[i]
        return q
    a = torch.randn(d, d, generator=gen, dtype=torch.float64)
    q, r = torch.linalg.qr(a)
    return q * torch.sign(torch.diagonal(r))[None]  # Haar measure (Mezzadri 2007)


def fold_and_rotate(layer: torch.nn.Module, q: torch.Tensor) -> torch.nn.Module:
    """A private copy of one Llama-style decoder layer computing ``f(x Q^T) Q`` from the residual ``x Q``."""
    names = {n for n, _ in layer.named_modules()}
    extra = sorted(n for n in names if n.endswith("layernorm") and n not in {f for f, _ in _NORM_FEEDS})
    missing = [n for n in (*READERS, *_WRITERS, *(f for f, _ in _NORM_FEEDS)) if n not in names]
    if missing or extra:
        raise DefenseError(f"permute supports Llama-style decoder layers (input and post-attention RMSNorm only); "
                           f"{type(layer).__name__} {'lacks ' + ', '.join(missing) if missing else 'has ' + ', '.join(extra)}"
                           "; use another defense for this model")
    out = copy.deepcopy(layer)
    q = q.to(next(out.parameters()).device)  # Q is drawn on the CPU; the layer may live on an accelerator
    with torch.no_grad():
        for norm_name, readers in _NORM_FEEDS:
            norm = out.get_submodule(norm_name)
            gain = norm.weight.double()  # (d,)
            for name in readers:
                lin = out.get_submodule(name)
                lin.weight.copy_(((lin.weight.double() * gain[None]) @ q).to(lin.weight.dtype))  # (out, d)
            norm.weight.fill_(1.0)
        for name in _WRITERS:
            lin = out.get_submodule(name)
            lin.weight.copy_((q.T @ lin.weight.double()).to(lin.weight.dtype))  # (d, in)
            if lin.bias is not None:
                lin.bias.copy_((lin.bias.double() @ q).to(lin.bias.dtype))
    return out


@register_defense("permute")
@dataclass(frozen=True)
class Permute(Defense):
    """Secret orthogonal basis Q of the hidden dimension (``mode``: signed permutation or rotation)."""

    mode: str = "signed"
    seed: int = 0

    strength = ("mode",)
    secret = ("seed",)
    cloud_weights = True  # the cloud must run body weights transformed with the secret

    def validate(self) -> None:
        if self.mode not in MODES:
            raise DefenseError(f"permute: mode={self.mode!r}; choose one of {', '.join(MODES)}, "
                               "e.g. --defense-option permute.mode=rotation")

    def matrix(self, d: int) -> torch.Tensor:
        """(d, d) float64 Q."""
        return basis(self.mode, self.seed, d)

    def apply(self, x: torch.Tensor, positions: Sequence[int], session: int, direction: str,
              content: Sequence[int] | None = None) -> torch.Tensor:
        """(T, d) head states -> (T, d) ``x Q`` (up); replies pass unchanged (the body already runs in Q's basis)."""
        if direction == "down":
            return x
        return (x.double() @ self.matrix(x.shape[-1]).to(x.device)).to(x.dtype)

    def restore(self, y: torch.Tensor) -> torch.Tensor:
        """Client: (..., d) body output in Q's basis -> (..., d) ``y Q^T``, what the tail expects."""
        return (y.double() @ self.matrix(y.shape[-1]).T.to(y.device)).to(y.dtype)

    def body_layers(self, layers: Sequence[torch.nn.Module], d: int) -> list[torch.nn.Module]:
        """Private transformed copies of the body's decoder layers: the weights handed to the cloud."""
        q = self.matrix(d)
        return [fold_and_rotate(layer, q) for layer in layers]
