"""``lora-random``: a seeded random low-rank perturbation of the local head layers (no training).

The seed paper's hypothesis (issue 13): perturb the local layers with a random
LoRA update (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models",
ICLR 2022) that the user keeps secret, so an attacker who holds the public
weights inverts the wrong function. Every linear map W (out, in) of the head's
decoder layers gets ``W + B A`` with A (rank, in) and B (out, rank) drawn from
N(0, 1) by the seed and B rescaled so that ``||B A||_F = scale * ||W||_F``
(``scale`` is the perturbation's size relative to the weight). The adapters
are built with ``peft`` and merged into private copies of the layers; the
loaded model is not modified. The seed is the secret; an attacker with the
public weights only is ``shadow`` (DESIGN.md section 4).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from splitinfer.defenses.base import Defense, DefenseError, register_defense

# The decoder layers' linear maps, by the names the tested families give them (splitinfer.families): Llama-style
# q/k/v/o and gate/up/down, fused qkv_proj and gate_up_proj (Phi-3, GLM-4), c_fc/c_proj (StarCoder2's MLP),
# and DeepSeek's latent attention (q_a/q_b, kv_a/kv_b). MoE experts held as fused 3-D parameters (Mixtral,
# Qwen-MoE, DeepSeek in transformers 5) and routers are not linear modules and stay untouched.
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj", "gate_up_proj",
           "c_fc", "c_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")


def lora_holder(layers: torch.nn.ModuleList, rank: int, random_b: bool = False) -> torch.nn.Module:
    """A module whose ``layers`` are private copies of ``layers`` with a peft LoRA of ``rank`` on every TARGETS map.

    peft's initialisation: A random (kaiming) and B zero, so the copies compute
    the base function, unless ``random_b`` (B random too; for callers that set
    the weights themselves).
    """
    from peft import LoraConfig, inject_adapter_in_model

    holder = torch.nn.Module()
    holder.layers = copy.deepcopy(layers)
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=list(TARGETS), lora_dropout=0.0,
                        init_lora_weights=not random_b)
    inject_adapter_in_model(config, holder)
    return holder


def merge_lora(layers: torch.nn.ModuleList, rank: int, init) -> torch.nn.ModuleList:
    """Private copies of ``layers`` with a peft LoRA (rank) whose weights ``init(name, lora_module)`` sets, merged."""
    from peft.tuners.lora import LoraLayer

    holder = lora_holder(layers, rank, random_b=True)
    lora = [(n, m) for n, m in holder.named_modules() if isinstance(m, LoraLayer)]
    if not lora:
        raise DefenseError(f"lora: the head layers have none of the linear maps {', '.join(TARGETS)}")
    with torch.no_grad():
        for name, m in lora:
            init(name, m)
            m.merge()
    for name, m in lora:  # swap each wrapper for its merged base layer
        parent = holder.get_submodule(name.rpartition(".")[0])
        setattr(parent, name.rpartition(".")[2], m.get_base_layer())
    return holder.layers


def copy_lora(weights: dict[str, torch.Tensor]) -> Callable[[str, Any], None]:
    """An ``init`` for :func:`merge_lora` that sets each adapter from ``weights``, the ``lora_`` entries of a
    :func:`lora_holder`'s ``named_parameters()`` (a trained adapter)."""

    def init(name: str, m) -> None:
        for part in ("lora_A", "lora_B"):
            getattr(m, part)["default"].weight.copy_(weights[f"{name}.{part}.default.weight"])

    return init


def with_head_layers(model: torch.nn.Module, layers: list) -> torch.nn.Module:
    """A shallow copy of a *ForCausalLM whose first ``len(layers)`` decoder layers are ``layers`` (others shared)."""
    out = copy.copy(model)
    out._modules = dict(out._modules)
    base = copy.copy(model.model)
    base._modules = dict(base._modules)
    base.layers = torch.nn.ModuleList(list(layers) + list(model.model.layers[len(layers):]))
    out.model = base
    return out


class HeadLora(Defense):
    """Base of the defenses that merge a LoRA update (weights from :meth:`lora_init`) into copies of the head layers."""

    kind = "model"
    rank: int

    def lora_init(self, head: torch.nn.Module) -> Callable[[str, Any], None]:  # pragma: no cover - each defense sets it
        """``init(name, lora_module)``: sets the adapter weights of one wrapped linear map."""
        raise NotImplementedError

    def apply_head(self, head: torch.nn.Module) -> None:
        """Replace ``head.layers`` by private copies with the update merged."""
        head.layers = merge_lora(head.layers, self.rank, self.lora_init(head))


@register_defense("lora-random")
@dataclass(frozen=True)
class LoraRandom(HeadLora):
    """Random rank-``rank`` update of relative Frobenius size ``scale`` on every head linear map."""

    rank: int = 8
    scale: float = 0.1
    seed: int = 0

    strength = ("rank", "scale")
    secret = ("seed",)

    def validate(self) -> None:
        if self.rank < 1:
            raise DefenseError(f"lora-random: rank={self.rank} must be >= 1; e.g. --defense-option lora-random.rank=8")
        if math.isinf(self.scale):
            raise DefenseError(f"lora-random: scale={self.scale} must be finite and >= 0; e.g. lora-random.scale=0.1")
        if not self.scale >= 0:
            raise DefenseError(f"lora-random: scale={self.scale} must be >= 0; e.g. lora-random.scale=0.1")

    def lora_init(self, head: torch.nn.Module) -> Callable[[str, Any], None]:
        """Seeded N(0, 1) draws for A and B, B rescaled to ``||B A||_F = scale * ||W||_F``."""
        gen = torch.Generator().manual_seed(self.seed)

        def init(name: str, m) -> None:
            a, b = m.lora_A["default"].weight, m.lora_B["default"].weight  # (r, in), (out, r)
            base = m.get_base_layer().weight  # (out, in)
            a.copy_(torch.randn(a.shape, generator=gen, dtype=torch.float32).to(a.dtype))
            b.copy_(torch.randn(b.shape, generator=gen, dtype=torch.float32).to(b.dtype))
            delta = (b.float() @ a.float()).norm()
            b.mul_(self.scale * base.float().norm() / delta if delta > 0 else 0.0)

        return init
