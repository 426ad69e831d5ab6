"""Cut a decoder-only transformer into a local head, a cloud body and a local tail.

``SplitConfig(head_layers=a, tail_layers=b)`` on an ``L``-layer model gives

- :class:`LocalHead`: token embedding + layers ``[0, a)``  (ids -> hidden)
- :class:`CloudBody`: layers ``[a, L - b)``                (hidden -> hidden)
- :class:`LocalTail`: layers ``[L - b, L)`` + final norm + LM head (hidden -> logits)

Each part runs the model's own decoder-layer modules on a
:class:`~splitinfer.kv_cache.PartKVCache` with explicit positions and masks,
and computes its rotary embeddings from the positions itself: cos/sin never
cross the wire. Works for the families :mod:`splitinfer.families` lists as
tested (sliding-window layers get a windowed mask, per-layer-type rotary
embeddings their own base, eager attention an additive mask) and refuses the rest.

A :class:`CloudBody` can be built from the body layers' tensors alone
(:meth:`CloudBody.from_weights`), so the cloud process never holds the
embedding matrix or the LM head.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from splitinfer import families
from splitinfer.errors import SplitInferError
from splitinfer.kv_cache import PartKVCache, additive_mask, attention_mask


@dataclass(frozen=True)
class SplitConfig:
    """How many decoder layers stay local before (head) and after (tail) the cloud body."""

    head_layers: int
    tail_layers: int

    @classmethod
    def parse(cls, text: str) -> SplitConfig:
        """Parse ``"a,b"`` (e.g. ``"2,2"``)."""
        try:
            a, b = (int(x) for x in str(text).split(","))
        except ValueError:
            raise SplitInferError(f"bad split {text!r}: write it as HEAD,TAIL layer counts, e.g. 2,2") from None
        return cls(a, b)

    def validate(self, num_layers: int) -> None:
        a, b = self.head_layers, self.tail_layers
        if a < 1 or b < 1:
            raise SplitInferError(f"bad split {a},{b}: head and tail need at least 1 layer each")
        if a + b >= num_layers:
            raise SplitInferError(
                f"bad split {a},{b}: the model has {num_layers} layers, so head + tail must be at most "
                f"{num_layers - 1} to leave the cloud at least one layer"
            )

    def body_layers(self, num_layers: int) -> range:
        self.validate(num_layers)
        return range(self.head_layers, num_layers - self.tail_layers)

    def __str__(self) -> str:
        return f"{self.head_layers},{self.tail_layers}"


def layer_types(config) -> list[str]:
    """Per-layer attention type: 'full_attention' or 'sliding_attention'."""
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    window = getattr(config, "sliding_window", None)
    sliding = window is not None and getattr(config, "use_sliding_window", True)
    return ["sliding_attention" if sliding else "full_attention"] * config.num_hidden_layers


class LayerStack(nn.Module):
    """A contiguous range of decoder layers with its rotary embedding.

    Public so that other packages can build their own stacks (the attacks' truncated forward)
    and run them with :meth:`run_layers` instead of reaching into the head, body or tail.
    """

    def __init__(self, config, layers: Sequence[nn.Module], first_layer: int, rotary: nn.Module):
        super().__init__()
        self.config = config
        self.first_layer = first_layer
        self.layers = nn.ModuleList(layers)
        self.rotary_emb = rotary
        types = layer_types(config)
        self.layer_types = types[first_layer : first_layer + len(self.layers)]
        self._rotary_takes_type = "layer_type" in inspect.signature(rotary.forward).parameters
        self.sliding_window = getattr(config, "sliding_window", None)

    @property
    def layer_indices(self) -> range:
        return range(self.first_layer, self.first_layer + len(self.layers))

    def new_cache(self) -> PartKVCache:
        return PartKVCache()

    def run_layers(
        self,
        hidden: torch.Tensor,  # (1, T, d)
        positions: torch.Tensor,  # (T,)
        cache: PartKVCache,
        parents: Sequence[int] | None,
        masks: dict[str, torch.Tensor | None] | None = None,
    ) -> torch.Tensor:  # (1, T, d)
        """Run every layer of the stack on ``hidden`` at ``positions``, appending to ``cache``.

        ``parents`` (a token tree's parent array, or None for a causal chain) shapes the mask;
        a batch ``(B, T, d)`` without cache entries and parents works too (one causal mask for all rows).
        ``masks`` (attention kind -> mask) replaces the masks built from ``cache`` and ``parents``:
        :mod:`splitinfer.packed_body` passes block-diagonal ones over several sessions' caches.
        """
        position_ids = positions.to(hidden.device)[None]  # (1, T)
        given = masks
        masks = {}
        rope: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        eager = getattr(self.config, "_attn_implementation", None) == "eager"  # adds its mask to the scores
        for kind in set(self.layer_types):
            window = self.sliding_window if kind == "sliding_attention" else None
            mask = given[kind] if given is not None else attention_mask(cache.positions, positions.cpu(), parents,
                                                                         window, explicit=eager)
            mask = None if mask is None else mask.to(hidden.device)
            masks[kind] = additive_mask(mask, hidden.dtype) if eager and mask is not None else mask
            if self._rotary_takes_type:
                rope[kind] = self.rotary_emb(hidden, position_ids, kind)
            else:
                rope[kind] = self.rotary_emb(hidden, position_ids=position_ids)
        for layer, kind in zip(self.layers, self.layer_types):
            hidden = layer(
                hidden,
                attention_mask=masks[kind],
                position_embeddings=rope[kind],
                position_ids=position_ids,
                cache=cache,
            )
        cache.append_positions(positions)
        return hidden


def _parts(model: nn.Module):
    """``model.model`` of a family the runtime splits exactly (see :mod:`splitinfer.families`; refuses others)."""
    return families.prepare(model).model


class LocalHead(LayerStack):
    """Embedding + the first ``a`` decoder layers; runs on the user's machine."""

    def __init__(self, model: nn.Module, split: SplitConfig):
        base = _parts(model)
        split.validate(len(base.layers))
        super().__init__(model.config, list(base.layers[: split.head_layers]), 0, base.rotary_emb)
        self.embed_tokens = base.embed_tokens

    @torch.no_grad()
    def forward(self, input_ids, positions, cache: PartKVCache, parents=None) -> torch.Tensor:
        """input_ids: (1, T) -> hidden states (1, T, d) sent to the cloud."""
        return self.run_layers(self.embed_tokens(input_ids), positions, cache, parents)


class CloudBody(LayerStack):
    """The middle decoder layers; the only part the cloud runs."""

    @classmethod
    def from_model(cls, model: nn.Module, split: SplitConfig) -> CloudBody:
        base = _parts(model)
        body = split.body_layers(len(base.layers))
        return cls(model.config, [base.layers[i] for i in body], body.start, base.rotary_emb)

    @classmethod
    def from_weights(
        cls, weights_dir: str | Path, split: SplitConfig, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> CloudBody:
        """Build the body from ``config.json`` and the body layers' safetensors alone.

        The model skeleton is instantiated on the meta device (no memory), the
        body layers are materialised and filled from the checkpoint, and
        nothing else (embedding, LM head, other layers) is ever read.
        """
        from safetensors import safe_open
        from transformers import AutoConfig, AutoModelForCausalLM

        weights_dir = Path(weights_dir)
        config = AutoConfig.from_pretrained(weights_dir)
        config._attn_implementation = families.attn_implementation(config)
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
        base = _parts(skeleton)
        body = split.body_layers(len(base.layers))
        layers = [base.layers[i].to_empty(device=device).to(dtype) for i in body]
        rotary = type(base.rotary_emb)(config=config).to(device)
        prefixes = {i: f"model.layers.{i}." for i in body}
        for file, keys in _checkpoint_files(weights_dir).items():
            wanted = [k for k in keys if any(k.startswith(p) for p in prefixes.values())]
            if not wanted:
                continue
            with safe_open(str(weights_dir / file), framework="pt", device="cpu") as f:
                for key in wanted:
                    layer = int(key.split(".")[2])
                    sub = key[len(prefixes[layer]) :]
                    target = layers[layer - body.start].get_parameter(sub)
                    with torch.no_grad():
                        target.copy_(f.get_tensor(key).to(dtype))
        del skeleton
        stack = cls(config, layers, body.start, rotary)
        for name, p in stack.named_parameters():
            if p.is_meta:
                raise SplitInferError(f"checkpoint in {weights_dir} lacks body weight {name}")
        return stack.eval()

    @torch.no_grad()
    def forward(self, hidden, positions, cache: PartKVCache, parents=None) -> torch.Tensor:
        """hidden: (1, T, d) from the head -> (1, T, d) for the tail."""
        return self.run_layers(hidden, positions, cache, parents)


def _checkpoint_files(weights_dir: Path) -> dict[str, list[str]]:
    """Map each safetensors file of a checkpoint to the tensor names it holds."""
    from safetensors import safe_open

    index = weights_dir / "model.safetensors.index.json"
    if index.exists():
        files: dict[str, list[str]] = {}
        for key, file in json.loads(index.read_text())["weight_map"].items():
            files.setdefault(file, []).append(key)
        return files
    single = weights_dir / "model.safetensors"
    if not single.exists():
        raise SplitInferError(f"no model.safetensors (or index) in {weights_dir}")
    with safe_open(str(single), framework="pt") as f:
        return {"model.safetensors": list(f.keys())}


class LocalTail(LayerStack):
    """The last ``b`` decoder layers + final norm + LM head; runs on the user's machine."""

    def __init__(self, model: nn.Module, split: SplitConfig):
        base = _parts(model)
        n = len(base.layers)
        split.validate(n)
        first = n - split.tail_layers
        super().__init__(model.config, list(base.layers[first:]), first, base.rotary_emb)
        self.norm = base.norm
        self.lm_head = model.lm_head
        self.softcap = getattr(model.config, "final_logit_softcapping", None)

    @torch.no_grad()
    def forward(self, hidden, positions, cache: PartKVCache, parents=None, return_final: bool = False):
        """hidden: (1, T, d) from the cloud -> logits (1, T, V) in fp32.

        ``return_final`` also returns the final normed states (1, T, d), what the LM head sees.
        """
        final = self.norm(self.run_layers(hidden, positions, cache, parents))  # (1, T, d)
        logits = self.logits(final)
        return (logits, final) if return_final else logits

    def logits(self, final: torch.Tensor) -> torch.Tensor:
        """Final normed states (..., d) -> logits (..., V) in fp32 (LM head, the family's scaling, soft-capping)."""
        logits = families.scale_logits(self.config, self.lm_head(final)).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def split_model(model: nn.Module, split: SplitConfig) -> tuple[LocalHead, CloudBody, LocalTail]:
    """The three parts of ``model``, sharing its modules (no copies)."""
    model.eval()
    return LocalHead(model, split), CloudBody.from_model(model, split), LocalTail(model, split)


def param_bytes(module: nn.Module) -> int:
    """Bytes of distinct parameters and buffers held by ``module``."""
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total
