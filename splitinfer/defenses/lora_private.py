"""``lora-private``: the local head layers fine-tuned privately with a LoRA adapter (the adapter is the secret).

The user trains a LoRA adapter (Hu et al., ICLR 2022; built with ``peft``) on
the head's decoder layers, on their own text, so that the whole model's outputs
stay close to the original: the loss is the KL divergence from the original
model's next-token distribution (distillation, Hinton et al. 2015) plus
``lm_weight`` times the language-modelling loss on the user's text. An attacker
holding only the public weights then inverts the wrong function: the ``shadow``
setting of DESIGN.md section 4. :func:`train_adapter` writes the adapter
(safetensors + JSON: rank, steps, depth, base model hash, a digest of each base
layer it fits, checked when the adapter is applied) under a path of the
user's choosing; adapters are secrets and never committed. The defense config
names that path; its strength axis is (rank, steps), read from the adapter.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from splitinfer.defenses.base import DefenseError, register_defense
from splitinfer.defenses.lora_random import HeadLora, copy_lora, lora_holder, with_head_layers
from splitinfer.tokens import added_tokens, encode_texts

log = logging.getLogger(__name__)


def layer_digest(layer: torch.nn.Module) -> str:
    """sha256 of one decoder layer's parameters (names, dtypes, shapes and bytes): the base an adapter fits."""
    h = hashlib.sha256()
    for name, p in sorted(layer.named_parameters()):
        t = p.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def trainable_lora(layers: torch.nn.ModuleList, rank: int, seed: int) -> torch.nn.Module:
    """:func:`lora_holder` over copies of ``layers`` with only the adapter trainable (seeded init: B = 0)."""
    torch.manual_seed(seed)  # peft's default init: A random (kaiming), B zero, so training starts at the base model
    holder = lora_holder(layers, rank)
    for name, p in holder.named_parameters():
        p.requires_grad_("lora_" in name)
    return holder


def training_windows(tokenizer: Any, texts: Sequence[str], seq_len: int) -> tuple[torch.Tensor, int]:
    """``(windows (S, seq_len), P)``: the texts' tokens packed end to end into windows, each opening as the
    tokenizer opens a text (its ``P`` prefix tokens: Gemma's, Llama's, Mistral's BOS; none for SmolLM2).

    Without the prefix a window of a BOS model starts mid-text with no BOS, a state the deployed model never
    sees (Gemma 3 degenerates without it), and the texts' own BOS lands mid-window. A model that adds nothing
    gets the texts' tokens concatenated and cut every ``seq_len``, as before.
    """
    prefix, _ = added_tokens(tokenizer)
    n_prefix = len(prefix)
    body = seq_len - n_prefix  # text tokens per window
    if body < 2:
        raise DefenseError(f"lora-private: seq_len={seq_len} leaves {body} text token(s) after the tokenizer's "
                           f"{n_prefix} prefix token(s); give seq_len >= {n_prefix + 2}")
    stream = [t for enc in encode_texts(tokenizer, list(texts)) for t in enc.ids[n_prefix:]]  # each without its prefix
    if len(stream) < body + 1:
        raise DefenseError(f"lora-private: the training texts hold {len(stream)} tokens; give at least {body + 1}")
    chunks = torch.tensor(stream[: len(stream) // body * body]).reshape(-1, body)  # (S, body)
    return torch.cat([torch.tensor(prefix, dtype=chunks.dtype).expand(len(chunks), n_prefix), chunks], 1), n_prefix


def train_adapter(loaded, depth: int, texts: Sequence[str], out: str | Path, *, rank: int = 8, steps: int = 100,
                  lr: float = 1e-3, seq_len: int = 64, batch: int = 4, lm_weight: float = 0.5, seed: int = 0,
                  regulariser: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                  extra_meta: Callable[[], dict] | None = None) -> Path:
    """Fit a LoRA adapter on the first ``depth`` layers to the user's texts; write it to ``out`` and return it.

    Each step draws ``batch`` windows of :func:`training_windows`. ``regulariser(states (B, T - P, d), ids (B,
    T - P))`` adds a term on the head's output states at the text positions (not the ``P`` public prefix ones)
    to each step's loss (``lora-adv``'s adversary); ``extra_meta()`` adds entries to the adapter's JSON.
    """
    from safetensors.torch import save_file

    from splitinfer.defenses.rerun import boundary

    data, n_prefix = training_windows(loaded.tokenizer, texts, seq_len)  # (S, seq_len)
    holder = trainable_lora(loaded.model.model.layers[:depth], rank, seed)
    student = with_head_layers(loaded.model, list(holder.layers))
    params = [p for p in holder.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    gen = torch.Generator().manual_seed(seed)  # batches drawn on the CPU, then moved: the same on every device
    device = next(loaded.model.parameters()).device
    last = float("nan")
    bar = tqdm(range(steps), desc="head adapter", unit="step", leave=False)
    for step in bar:
        x = data[torch.randint(0, len(data), (min(batch, len(data)),), generator=gen)].to(device)  # (B, seq_len)
        with torch.no_grad():
            teacher = torch.log_softmax(loaded.model(x).logits.float(), -1)  # (B, seq_len, V)
        logits, states = boundary(student, x, reads=(depth,) if regulariser else ())
        logits = logits.float()
        logp = torch.log_softmax(logits, -1)
        kl = torch.nn.functional.kl_div(logp, teacher, log_target=True, reduction="batchmean") / x.shape[1]
        lm = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        # the regulariser reads the text's positions only: the prefix is public and the same in every window
        loss = kl + lm_weight * lm + (regulariser(states[depth][:, n_prefix:], x[:, n_prefix:]) if regulariser else 0.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        last = float(loss.detach())
        if step % 20 == 0:
            bar.set_postfix(loss=f"{last:.4f}", kl=f"{float(kl.detach()):.4f}")
            log.info("lora-private step %d: loss %.4f (kl %.4f)", step, last, float(kl.detach()))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({n: p.detach().cpu().contiguous() for n, p in holder.named_parameters() if "lora_" in n},
              str(out / "adapter.safetensors"))
    meta = {"rank": rank, "steps": steps, "depth": depth, "lr": lr, "lm_weight": lm_weight, "seed": seed,
            "base_sha256": loaded.sha256, "layer_sha256": [layer_digest(x) for x in loaded.model.model.layers[:depth]],
            "train_tokens": int(data.numel()), "final_loss": last, **(extra_meta() if extra_meta else {})}
    (out / "adapter.json").write_text(json.dumps(meta, indent=1))
    return out


@register_defense("lora-private")
@dataclass(frozen=True)
class LoraPrivate(HeadLora):
    """A privately trained LoRA adapter on the head layers (``adapter``: a directory from train_adapter)."""

    adapter: str = ""
    rank: int = 8
    steps: int = 100

    strength = ("rank", "steps")
    secret = ("adapter",)

    def validate(self) -> None:
        if self.rank < 1 or self.steps < 0:
            raise DefenseError(f"{self.name}: need rank >= 1 and steps >= 0; e.g. --defense-option {self.name}.rank=8")

    def describe(self) -> str:
        """The public label: the adapter's location is part of the secret."""
        return self.label(public=True)

    def lora_init(self, head: torch.nn.Module) -> Callable[[str, Any], None]:
        """The adapter's trained weights (checked to cover this head at this rank)."""
        from safetensors.torch import load_file

        path = Path(self.adapter)
        if not (path / "adapter.safetensors").is_file():
            raise DefenseError(f"lora-private: no adapter at {self.adapter!r}; train one (train_adapter) and pass "
                               "--defense-option lora-private.adapter=DIR")
        meta = json.loads((path / "adapter.json").read_text())
        if meta["depth"] < len(head.layers) or meta["rank"] != self.rank:
            raise DefenseError(f"lora-private: the adapter at {self.adapter} covers {meta['depth']} layers at rank "
                               f"{meta['rank']}; this head has {len(head.layers)} layers and asks rank {self.rank}")
        digests = meta.get("layer_sha256")
        if not digests:
            raise DefenseError(f"lora-private: the adapter at {self.adapter} does not record the base layers it was "
                               "trained on (an older splitinfer wrote it); train it again with train_adapter")
        differ = next((i for i, x in enumerate(head.layers) if layer_digest(x) != digests[i]), None)
        if differ is not None:
            raise DefenseError(f"lora-private: the adapter at {self.adapter} was trained on other base weights "
                               f"or dtype (head layer {differ} differs; it records model sha256 "
                               f"{str(meta.get('base_sha256'))[:12]}); train an adapter on this model")
        return copy_lora(load_file(str(path / "adapter.safetensors")))
