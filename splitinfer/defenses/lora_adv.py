"""``lora-adv``: a LoRA on the head trained against an inversion adversary (NoPeek / ADMI line).

The adversarial-regularisation line of split-learning defenses: NoPeek
(Vepakomma et al., "NoPeek: Information leakage reduction to share activations
in distributed deep learning", 2020) lowers the dependence between the raw
input and the released activations, and ADMI (arXiv 2606.14210) trains the
local layers against a learned inversion adversary while keeping the model's
outputs close. Here the head's decoder layers get a LoRA adapter (as
``lora-private``: :func:`splitinfer.defenses.lora_private.train_adapter`,
distillation KL to the original model plus ``lm_weight`` times the language-
modelling loss) with one more term: ``-weight * CE`` of an adversary, a linear
token classifier on the RMS-normalised head states that is itself trained (one
Adam step per adapter step, on detached states) to name each position's token.
The adapter is pushed to states the adversary cannot read while the KL keeps
the tail's outputs close.

The adapter is then *fixed* and scored against attackers that never saw
training: fresh adaptive attackers trained on the fixed adapter's own outputs
(the strongest case: the adapter disclosed, ``white-box``), and the
public-weights matching attack (``shadow``). The training adversary is
discarded; the adapter's JSON records the sha256 of its final weights
(``train_attacker_sha256``) so a scorer can prove it is not scoring with it
(:func:`check_fresh`).

Deviations: the adversary is linear, not ADMI's decoder; the CE is capped at
log |V| per position (past chance the term gives no gradient, so the adapter
cannot buy privacy by making the adversary confidently wrong); no
mutual-information estimator.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from splitinfer.defenses.base import DefenseError, register_defense
from splitinfer.defenses.lora_private import LoraPrivate, train_adapter

__all__ = ["LoraAdv", "Adversary", "train_adversarial_adapter", "check_fresh", "state_digest"]


def state_digest(module: torch.nn.Module) -> str:
    """sha256 of a module's parameters (names and float32 bytes)."""
    h = hashlib.sha256()
    for name, p in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class Adversary(torch.nn.Module):
    """The training-time inverter: a linear token classifier on RMS-normalised states, trained online."""

    def __init__(self, d: int, vocab: int, weight: float, lr: float = 1e-3, seed: int = 0,
                 device: torch.device | str = "cpu"):
        super().__init__()
        torch.manual_seed(seed)
        self.linear = torch.nn.Linear(d, vocab).to(device)  # initialised on the CPU (the same draws), then moved
        self.weight, self.cap = weight, math.log(vocab)
        self.opt = torch.optim.Adam(self.parameters(), lr=lr)
        self.last_ce = float("nan")

    def ce(self, states: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """(B, T, d), (B, T) -> mean cross-entropy of naming each token from its state."""
        z = states.float() / states.float().pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()  # (B, T, d)
        return torch.nn.functional.cross_entropy(self.linear(z).reshape(-1, self.linear.out_features), ids.reshape(-1))

    def __call__(self, states: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:  # the adapter's loss term
        self.opt.zero_grad()
        self.ce(states.detach(), ids).backward()  # the adversary's step on the current states
        self.opt.step()
        for p in self.parameters():
            p.grad = None
        ce = self.ce(states, ids)
        self.last_ce = float(ce.detach())
        return -self.weight * torch.clamp(ce, max=self.cap)


def train_adversarial_adapter(loaded, depth: int, texts: Sequence[str], out: str | Path, *, rank: int = 8,
                              steps: int = 100, weight: float = 0.1, seed: int = 0, **kw) -> Path:
    """Train a ``lora-adv`` adapter (see the module docstring) into ``out``; the adversary is dropped after."""
    adversary = Adversary(int(loaded.hidden_size), int(loaded.config.vocab_size), weight, seed=seed + 7919,
                          device=next(loaded.model.parameters()).device)  # beside the head states it reads
    for p in adversary.parameters():
        p.requires_grad_(True)
    path = train_adapter(loaded, depth, texts, out, rank=rank, steps=steps, seed=seed, regulariser=adversary,
                         extra_meta=lambda: {"defense": "lora-adv", "weight": weight,
                                             "train_attacker": "linear (online)",
                                             "train_attacker_final_ce": adversary.last_ce,
                                             "train_attacker_sha256": state_digest(adversary.linear)}, **kw)
    return path


def check_fresh(attacker: torch.nn.Module, adapter_dir: str | Path) -> None:
    """DefenseError if ``attacker``'s weights are the adapter's training adversary's (a scorer must train anew)."""
    import json

    meta = json.loads((Path(adapter_dir) / "adapter.json").read_text())
    if state_digest(attacker) == meta.get("train_attacker_sha256"):
        raise DefenseError(f"lora-adv: the attacker scoring the adapter at {adapter_dir} is the adversary it was "
                           "trained against; score it with fresh attackers trained on its fixed outputs")


@register_defense("lora-adv")
@dataclass(frozen=True)
class LoraAdv(LoraPrivate):
    """A LoRA adapter on the head trained against an online linear inverter (``weight``: the adversarial term)."""

    weight: float = 0.1

    strength = ("rank", "steps", "weight")
    secret = ("adapter",)

    def validate(self) -> None:
        super().validate()
        if not (0 <= self.weight < float("inf")):
            raise DefenseError(f"lora-adv: weight={self.weight} must be finite and >= 0; e.g. lora-adv.weight=0.1")

    def train(self, loaded, depth: int, texts: Sequence[str], out: str | Path, seed: int = 0) -> Path:
        """Train this config's adapter (the stage calls it when the spec names no adapter)."""
        return train_adversarial_adapter(loaded, depth, texts, out, rank=self.rank, steps=self.steps,
                                         weight=self.weight, seed=seed)
