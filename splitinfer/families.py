"""Which decoder families the split runtime runs exactly, and a one-line refusal for every other one.

The runtime (:mod:`splitinfer.partition`) runs a model's own decoder-layer modules on its own caches
and masks, so it is right for a family only when everything the family's ``*Model.forward`` and
``*ForCausalLM.forward`` do *around* the layers is reproduced by the head and the tail:

- the input embedding (Gemma scales it inside its embedding module; Granite multiplies it by
  ``embedding_multiplier`` in ``forward``: :func:`prepare` moves that factor into the embedding
  module, so the head, the taps and the attacks all embed as the model does);
- the attention masks: causal and sliding-window layers only (``chunked_attention``, Llama 4's, is
  refused); eager attention (Gemma 2's soft-capping, gpt-oss's sinks) takes an additive mask
  (:func:`splitinfer.kv_cache.additive_mask`), and loading picks it (:func:`attn_implementation`);
- the logits: soft-capping (Gemma 2/3), ``logit_scale`` (Cohere), ``logits_scaling`` (Granite),
  applied by :func:`scale_logits`.

Every family in :data:`TESTED` is built as a tiny random model in
``tests/splitinfer/test_families.py`` and checked there: split == unsplit (greedy tokens identical,
logits within the float floor) for sequential and speculative decoding, KV commit and crop, tap
extraction, an attacker fit and a defense. A family in :data:`REFUSED` is known to be split wrongly
or not at all; any other family is untested and refused too, unless ``SPLITINFER_ALLOW_UNTESTED=1``
(then a warning), because five of the structurally compatible families we tried (Cohere, Cohere2,
Granite, Gemma 2, gpt-oss) ran wrong without an error before this module existed.
"""

from __future__ import annotations

import logging
import os

import torch
from torch import nn

from splitinfer.errors import SplitInferError

log = logging.getLogger(__name__)

ALLOW_ENV = "SPLITINFER_ALLOW_UNTESTED"
_WARNED: set[str] = set()  # untested families already warned about in this process
LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})

# model_type -> what users call it (the test file builds each one; docs/models.md lists them)
TESTED: dict[str, str] = {
    "llama": "Llama 2 / Llama 3 / SmolLM2",
    "mistral": "Mistral (sliding window)",
    "mixtral": "Mixtral (MoE)",
    "qwen2": "Qwen2 / Qwen2.5 (sliding-window layers)",
    "qwen2_moe": "Qwen2-MoE (shared expert)",
    "qwen3": "Qwen3 (q/k norm)",
    "qwen3_moe": "Qwen3-MoE",
    "gemma": "Gemma (scaled embedding)",
    "gemma2": "Gemma 2 (attention soft-capping, eager attention)",
    "gemma3_text": "Gemma 3 text (sliding layers, per-layer-type rotary)",
    "phi3": "Phi-3 / Phi-3.5 / Phi-4-mini (fused qkv, partial rotary)",
    "olmo2": "OLMo 2 (post-norm, q/k norm)",
    "granite": "Granite 3 (embedding, residual and logit multipliers)",
    "cohere": "Command R (parallel block, logit scale)",
    "cohere2": "Command R7B (sliding layers, logit scale)",
    "starcoder2": "StarCoder2 (LayerNorm, biases)",
    "deepseek_v3": "DeepSeek-V3 / R1 (MLA attention, MoE)",
    "smollm3": "SmolLM3 (NoPE layers)",
    "exaone4": "EXAONE 4 (sliding layers, post-norm)",
    "glm4": "GLM-4 (partial rotary, extra norms)",
    "gpt_oss": "gpt-oss (attention sinks, eager attention, MoE)",
}

# model_type -> what the runtime lacks (one clause; the refusal names the family around it)
REFUSED: dict[str, str] = {
    "gpt_neox": "its modules are gpt_neox.embed_in / layers / final_layer_norm / embed_out, and the runtime maps "
                "only model.embed_tokens / layers / norm / lm_head",
    "falcon": "its modules are transformer.word_embeddings / h / ln_f (and some checkpoints use ALiBi), and the "
              "runtime maps only model.embed_tokens / layers / norm / lm_head with rotary positions",
    "gpt2": "its modules are transformer.wte / wpe / h / ln_f with learned absolute positions, which the runtime "
            "does not map",
    "llama4_text": "its chunked-attention layers need chunked masks, which the runtime does not build",
    "gemma3": "it is the multimodal Gemma 3 wrapper; load the text model (model_type gemma3_text) instead",
}


# families whose hidden states leave fp16's range (65,504): trained in bf16, their embedding scale and massive
# activations put states far beyond it (Gemma 3 270M's BOS state at every depth)
WIDE_STATES = frozenset({"gemma", "gemma2", "gemma3_text"})


def default_wire_dtype(config) -> str:
    """The hidden-state dtype a split of this family sends when none is named: ``fp16`` (half of fp32's bytes), or
    ``bf16`` for a family in :data:`WIDE_STATES`. (The runtime refuses a state that overflows its wire dtype.)"""
    return "bf16" if family(config) in WIDE_STATES else "fp16"


def family(config) -> str:
    """The config's ``model_type`` (the family name transformers uses)."""
    return str(getattr(config, "model_type", None) or type(config).__name__)


def missing_in_config(config) -> str | None:
    """What the runtime lacks for the family of ``config`` (one clause), or None; readable before any weight loads."""
    name = family(config)
    if name in REFUSED:
        return REFUSED[name]
    odd = sorted(set(getattr(config, "layer_types", None) or ()) - LAYER_TYPES)
    if odd:
        return f"its {', '.join(odd)} layers need masks the runtime does not build (it builds causal and sliding)"
    return None


def missing(model: nn.Module) -> str | None:
    """What the runtime lacks to split ``model`` exactly (one clause), or None when it can."""
    base = getattr(model, "model", None)
    parts = ("embed_tokens", "layers", "norm", "rotary_emb")
    if base is None or not all(hasattr(base, p) for p in parts) or not hasattr(model, "lm_head"):
        return missing_in_config(model.config) or (
            "its modules are not laid out as model.embed_tokens / layers / norm / rotary_emb plus lm_head, "
            "which is all the runtime maps")
    return missing_in_config(model.config)


def check(model: nn.Module) -> None:
    """Raise :class:`SplitInferError` (one line naming the family and what is missing) unless ``model`` splits.

    An untested family that passes the structural checks is refused as well, unless the environment
    sets ``SPLITINFER_ALLOW_UNTESTED=1``, which turns the refusal into a warning.
    """
    _verdict(model.config, missing(model), type(model).__name__)


def check_config(config) -> None:
    """:func:`check` on a config alone, before any weight is loaded (the module layout is checked later)."""
    _verdict(config, missing_in_config(config), type(config).__name__.removesuffix("Config"))


def _verdict(config, reason: str | None, what: str) -> None:
    name = family(config)
    if reason is not None:
        raise SplitInferError(f"cannot split model family {name!r} ({what}): {reason}; "
                              f"the tested families are listed in docs/models.md")
    if name in TESTED:
        return
    if os.environ.get(ALLOW_ENV) == "1":
        if name in _WARNED:
            return
        _WARNED.add(name)
        log.warning("model family %r is untested: split results may differ from the unsplit model "
                    "(%s=1 is set); check split == unsplit before citing any figure", name, ALLOW_ENV)
        return
    raise SplitInferError(f"model family {name!r} ({what}) is untested with the split runtime, "
                          f"which may run it wrongly; add it to splitinfer.families.TESTED with a tiny config in "
                          f"tests/splitinfer/test_families.py, or set {ALLOW_ENV}=1 to run it at your own risk")


class MultipliedEmbedding(nn.Embedding):
    """An embedding whose output is multiplied by a constant (Granite's ``embedding_multiplier``).

    It shares the original module's weight (so tying with the LM head and the state-dict names are
    unchanged) and returns what the model's first decoder layer sees.
    """

    def __init__(self, inner: nn.Embedding, multiplier: float):
        super().__init__(inner.num_embeddings, inner.embedding_dim, inner.padding_idx, device="meta")
        self.weight = inner.weight
        self.multiplier = float(multiplier)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, d)
        return super().forward(input_ids) * self.multiplier


def prepare(model: nn.Module) -> nn.Module:
    """Check ``model`` (see :func:`check`) and move factors its ``forward`` applies into its modules; in place.

    Granite: ``model.model.embedding_multiplier`` moves into the embedding module (the model's own
    forward then multiplies by 1.0, so its outputs are unchanged). Idempotent.
    """
    check(model)
    base = model.model
    factor = getattr(base, "embedding_multiplier", None)
    if factor is not None and not isinstance(base.embed_tokens, MultipliedEmbedding) and float(factor) != 1.0:
        base.embed_tokens = MultipliedEmbedding(base.embed_tokens, factor)
        base.embedding_multiplier = 1.0
    return model


def attn_implementation(config) -> str:
    """``eager`` where sdpa would drop a feature the family needs (attention soft-capping) or the family's
    class has no sdpa path (Gemma 2), else ``sdpa``."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "eager"
    try:
        cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        return "sdpa"
    return "sdpa" if getattr(cls, "_supports_sdpa", True) else "eager"


def scale_logits(config, logits: torch.Tensor) -> torch.Tensor:  # (..., V) -> (..., V)
    """The family's logit scaling after the LM head, in the order and arithmetic its forward uses.

    Cohere multiplies by ``logit_scale``, Granite divides by ``logits_scaling``; soft-capping
    (Gemma 2/3) is applied by the caller after this.
    """
    name = family(config)
    if name in ("cohere", "cohere2"):
        return logits * config.logit_scale
    if name in ("granite", "granitemoe") and getattr(config, "logits_scaling", 1.0) != 1.0:
        return logits / config.logits_scaling
    return logits
