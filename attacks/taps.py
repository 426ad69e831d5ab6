"""Activation taps: the hidden states the cloud sees at a split boundary, by truncated forward.

Boundaries are :class:`~attacks.boundary.Boundary` objects, written ``head:A``
or ``tail:B`` (see :mod:`attacks.boundary`; re-exported here).

:class:`TruncatedForward` runs the embedding and only the needed layers, with
the runtime's own layer runner (the model's decoder-layer modules on a fresh
:class:`~splitinfer.kv_cache.PartKVCache`), so batch-1 states are
bit-identical to what ``LocalHead`` sends for the same token ids.
There is one extractor: a corpus split is planned (:mod:`attacks.tapplan`:
tokenized with character offsets, cut into sequences of at most ``max_length``
tokens that each start at position 0, stopped at ``max_tokens``) and run through
:func:`forward_rows`, one truncated forward that keeps the states after every
requested depth. :func:`extract_taps` writes them as fp16 shards
(:mod:`attacks.tapstore`) under ``cache_dir()/taps/``, keyed by model sha256,
corpus manifest, split, boundary, max length and max tokens, and resumes where
it stopped; :func:`extract_depths` returns several depths at once in memory
(:class:`~attacks.tapdata.Taps`, nothing cached).

Batching: by default only sequences of *equal length* share a batch, so
no padding or mask is needed. ``batch_size=1`` gives states bit-identical to
what ``LocalHead`` sends for the same text (tested, fp32); larger batches
can take other BLAS / attention code paths and agree to float rounding
(about 2e-6 on the default model, far below fp16 storage precision).
``padded=True`` also batches unequal lengths with right padding, which is
exact under the causal mask up to float reassociation (about 1e-4 on the
default model at depth 4) and about 15% faster on short chat documents.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attacks.boundary import Boundary
from attacks.errors import AttackError
from attacks.tapdata import Taps
from attacks.tapplan import Plan, pad_batch, plan_batches, plan_sequences
from attacks.tapstore import FORMAT_VERSION, TapSet, matching_index, shard_complete, write_index, write_shard
from splitinfer.kv_cache import PartKVCache
from splitinfer.partition import LayerStack

log = logging.getLogger(__name__)

# tap dtype -> (the wire's torch dtype the states are rounded to, numpy storage); bf16 is stored as float32
STORE_DTYPES = {"fp16": (torch.float16, np.float16), "bf16": (torch.bfloat16, np.float32),
                "fp32": (torch.float32, np.float32)}
TORCH_OF = {np.float16: torch.float16, np.float32: torch.float32}


class TruncatedForward(LayerStack):
    """Token embedding + decoder layers ``[0, depth)`` of a causal LM; returns the hidden states after them."""

    def __init__(self, model: torch.nn.Module, depth: int):
        base = getattr(model, "model", None)
        if base is None or not hasattr(base, "layers") or not hasattr(base, "embed_tokens"):
            raise AttackError(f"cannot tap a {type(model).__name__}: expected a decoder-only *ForCausalLM with "
                              "model.embed_tokens and model.layers")
        if not 1 <= depth <= len(base.layers):
            raise AttackError(f"depth {depth} is outside the model: it has {len(base.layers)} layers")
        super().__init__(model.config, list(base.layers[:depth]), 0, base.rotary_emb)
        self.embed_tokens = base.embed_tokens
        self.depth = depth

    @classmethod
    def for_boundary(cls, loaded, boundary: str | Boundary) -> TruncatedForward:
        """The truncated forward reaching ``boundary`` of ``loaded`` (a LoadedModel)."""
        return cls(loaded.model, Boundary.parse(boundary).depth(loaded.num_layers))

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (B, T), right-padded if ragged -> hidden states (B, T, d); positions are 0..T-1."""
        positions = torch.arange(input_ids.shape[1])  # (T,)
        return self.run_layers(self.embed_tokens(input_ids), positions, PartKVCache(), None)


# ---------------------------------------------------------------------------- extraction


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:48] or "x"


def taps_root() -> Path:
    """Root of the tap cache: ``cache_dir()/taps``."""
    from splitinfer.models import cache_dir

    return cache_dir() / "taps"


def _check_args(max_length: int, max_tokens: int | None, batch_size: int, dtype: str, shard_tokens: int,
                max_positions: int) -> None:
    def bad(name: str, value: Any) -> bool:
        return isinstance(value, bool) or not isinstance(value, int) or value < 1

    for name, value in (("max_length", max_length), ("batch_size", batch_size), ("shard_tokens", shard_tokens)):
        if bad(name, value):
            raise AttackError(f"{name}={value!r} must be a positive integer")
    if max_tokens is not None and bad("max_tokens", max_tokens):
        raise AttackError(f"max_tokens={max_tokens!r} must be a positive integer or None (all tokens)")
    if max_positions and max_length > max_positions:
        raise AttackError(f"max_length={max_length} exceeds the model's context of {max_positions} positions")
    if dtype not in STORE_DTYPES:
        raise AttackError(f"unknown tap dtype {dtype!r}; choose one of {', '.join(STORE_DTYPES)}")


def extract_taps(
    loaded: Any,
    corpus: str,
    boundary: str | Boundary,
    split: str | None = None,
    *,
    max_tokens: int | None = None,
    max_length: int = 256,
    batch_size: int = 4,
    padded: bool = False,
    dtype: str = "fp16",
    seed: int = 0,
    max_docs: int | None = None,
    corpus_options: dict[str, Any] | None = None,
    shard_tokens: int = 32768,
    root: str | Path | None = None,
    progress: bool = True,
    on_shard: Callable[[int], None] | None = None,
) -> TapSet:
    """Hidden states at ``boundary`` for a corpus split, from the cache or computed (and cached).

    ``loaded`` is a :class:`~splitinfer.models.LoadedModel`. ``split=None``
    uses the corpus default (``train`` for built-ins, ``all`` for ``file:`` /
    ``hf:``). ``max_tokens`` caps the tokens taken (documents in split order;
    the last one is cut). ``root`` overrides ``cache_dir()/taps``.
    ``on_shard(i)`` is called after shard ``i`` is written. Returns the
    complete :class:`~attacks.tapstore.TapSet`.
    """
    from splitinfer.corpora import corpus_manifest, load_corpus

    t_start = time.perf_counter()
    b = Boundary.parse(boundary)
    depth = b.depth(loaded.num_layers)
    _check_args(max_length, max_tokens, batch_size, dtype, shard_tokens,
                int(getattr(loaded.config, "max_position_embeddings", 0) or 0))
    tok, options = loaded.tokenizer, dict(corpus_options or {})
    manifest = corpus_manifest(corpus, split, seed, max_docs, tok, **options)
    manifest_sha = hashlib.sha256(json.dumps(manifest, sort_keys=True, default=str).encode()).hexdigest()
    key_fields = {
        "format_version": FORMAT_VERSION, "model_sha256": loaded.sha256, "corpus_manifest_sha256": manifest_sha,
        "split": manifest["split"], "boundary": str(b), "depth": depth, "max_length": max_length,
        "max_tokens": max_tokens, "dtype": dtype, "padded": padded, "batch_size": batch_size,
        "shard_tokens": shard_tokens,
    }
    key = hashlib.sha256(json.dumps(key_fields, sort_keys=True).encode()).hexdigest()[:16]
    name = f"{_slug(corpus)}-{manifest['split']}-{b.side}{b.layers}-len{max_length}-{key}"
    directory = Path(root) if root is not None else taps_root()
    directory = directory / f"{_slug(loaded.spec)}-{loaded.sha256[:8]}" / name
    old = matching_index(directory, key_fields)
    if old is not None and old.get("complete"):
        log.info("taps cache hit: %s", directory)
        return TapSet(directory)
    dataset = load_corpus(corpus, split, seed, max_docs, tok, **options)  # only on a miss: builders can be slow
    plan = plan_sequences(dataset, tok, max_length, max_tokens, shard_tokens)
    if not plan.chunks:
        raise AttackError(f"corpus {corpus!r} split {manifest['split']!r} yields no tokens (all {len(dataset)} "
                          "documents are empty); pick a corpus with text")
    index = {
        "format_version": FORMAT_VERSION, "kind": "teacher-forced", "complete": False, "key": key_fields,
        "model": loaded.spec, "model_sha256": loaded.sha256, "num_layers": loaded.num_layers,
        "hidden_size": loaded.hidden_size, "corpus": corpus, "corpus_options": options, "seed": seed,
        "max_docs": max_docs, "split": manifest["split"], "boundary": str(b), "depth": depth,
        "max_length": max_length, "max_tokens": max_tokens, "dtype": np.dtype(STORE_DTYPES[dtype][1]).name,
        "wire_dtype": dtype,
        "padded": padded, "batch_size": batch_size, "n_tokens": int(sum(c["length"] for c in plan.chunks)),
        "pii_types": plan.pii_types,
        "corpus_manifest": {k: v for k, v in manifest.items() if k != "doc_ids"},
        "documents": plan.documents, "chunks": plan.chunks, "shards": plan.shards,
    }
    if directory.exists() and (old is None or old.get("chunks") != plan.chunks or old.get("shards") != plan.shards):
        log.warning("taps at %s are unreadable or were planned differently; starting over", directory)
        shutil.rmtree(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_index(directory, index)
    t_run, cpu_run = time.perf_counter(), time.process_time()
    stack = TruncatedForward(loaded.model, depth)
    computed, forward_cpu = _run_shards(loaded, stack, plan, directory, batch_size, padded, dtype,
                                        f"taps {corpus} {b}", progress, on_shard)
    t_end = time.perf_counter()
    # prepare: corpus, manifest, tokenization, planning; run: forward, cast, shard writes (this call's share)
    index["timing"] = {"prepare_s": t_run - t_start, "run_s": t_end - t_run,
                       "run_cpu_s": time.process_time() - cpu_run, "forward_cpu_s": forward_cpu,
                       "tokens_computed": computed}
    index["complete"] = True
    write_index(directory, index)
    return TapSet(directory)


def forward_rows(loaded: Any, stack: TruncatedForward, plan: Plan, rows: Sequence[int], depths: Sequence[int],
                 batch_size: int, padded: bool, dtype: str, bar: Any = None) -> tuple[dict[int, np.ndarray], float]:
    """The one extractor's forward: states after each of ``depths`` for the sequences ``rows`` of ``plan``.

    Runs ``stack`` (embedding + layers up to the deepest of ``depths``) once per batch and keeps the output
    of every requested layer (forward hooks). Returns ``{depth: (N, d)}`` in ``rows`` order, stored as
    ``dtype``, and the CPU seconds spent inside the forward itself.
    """
    torch_dtype, np_dtype = STORE_DTYPES[dtype]
    device = next(loaded.model.parameters()).device
    pad_id = int(loaded.tokenizer.pad_token_id or 0)
    lengths = [plan.chunks[i]["length"] for i in rows]
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    out = {d: np.empty((int(starts[-1]), loaded.hidden_size), dtype=np_dtype) for d in depths}  # depth -> (N, d)
    captured: dict[int, torch.Tensor] = {}
    hooks = [stack.layers[d - 1].register_forward_hook(
        lambda _m, _i, o, d=d: captured.__setitem__(d, o[0] if isinstance(o, tuple) else o)) for d in depths]
    forward_cpu = 0.0
    try:
        for batch in plan_batches(lengths, batch_size, padded):
            ids = pad_batch([plan.ids[rows[j]] for j in batch], pad_id).to(device)  # (B, T)
            c0 = time.process_time()
            stack(ids)  # (B, T, d); the hooks fill ``captured``
            forward_cpu += time.process_time() - c0
            for d in depths:
                h = captured[d].to(torch_dtype).cpu().to(TORCH_OF[np_dtype]).numpy()  # (B, T, d), wire-rounded
                for k, j in enumerate(batch):
                    out[d][starts[j]: starts[j + 1]] = h[k, : lengths[j]]
            if bar is not None:
                bar.update(sum(lengths[j] for j in batch))
    finally:
        for h in hooks:
            h.remove()
    return out, forward_cpu


def _run_shards(loaded: Any, stack: TruncatedForward, plan: Plan, directory: Path, batch_size: int, padded: bool,
                dtype: str, desc: str, progress: bool, on_shard: Callable[[int], None] | None) -> tuple[int, float]:
    """Compute and write every shard of ``plan`` whose file does not exist yet.

    Returns the tokens computed and the CPU seconds spent inside the forward itself.
    """
    from tqdm.auto import tqdm

    d = loaded.hidden_size
    rows_of: list[list[int]] = [[] for _ in plan.shards]
    for i, c in enumerate(plan.chunks):
        rows_of[c["shard"]].append(i)
    todo = [s for s, e in enumerate(plan.shards) if not shard_complete(directory / e["file"], e["n_tokens"], d)]
    total = sum(e["n_tokens"] for e in plan.shards)
    done = total - sum(plan.shards[s]["n_tokens"] for s in todo)
    if done:
        log.info("resuming %s: %d of %d shards already written", directory, len(plan.shards) - len(todo),
                 len(plan.shards))
    forward_cpu = 0.0
    with tqdm(total=total, initial=done, unit="tok", desc=desc, disable=not progress, leave=False) as bar:
        for s in todo:
            rows = rows_of[s]
            states, cpu = forward_rows(loaded, stack, plan, rows, [len(stack.layers)], batch_size, padded, dtype, bar)
            forward_cpu += cpu
            write_shard(directory / plan.shards[s]["file"], {
                "hidden": states[len(stack.layers)],
                "token_ids": np.concatenate([plan.ids[i] for i in rows]),
                "positions": np.concatenate([np.arange(plan.chunks[i]["length"], dtype=np.int32) for i in rows]),
                "offsets": np.concatenate([plan.offsets[i] for i in rows]),
                "pii_labels": np.concatenate([plan.labels[i] for i in rows]),
            })
            log.debug("wrote %s", plan.shards[s]["file"])
            if on_shard is not None:
                on_shard(s)
    return total - done, forward_cpu


def extract_depths(loaded: Any, corpus: str, boundaries: Sequence[str | Boundary], split: str | None = None, *,
                   max_tokens: int | None = None, max_length: int = 128, max_doc_tokens: int | None = None,
                   batch_size: int = 8, dtype: str = "fp16", seed: int = 0,
                   progress: bool = True) -> dict[str | Boundary, Taps]:
    """In memory, not cached: ``{boundary: Taps}`` for one corpus split, in ONE truncated forward to the deepest.

    Keyed as the boundaries were given: a :class:`Boundary` by itself, a string by its canonical
    ``side:N`` form. The same plan and forward as :func:`extract_taps` (:func:`forward_rows`,
    equal-length batches), so the states are the ones the cloud sees; ``max_doc_tokens`` caps tokens per
    document, and PII spans that start in a document's covered text are kept (``partial_spans``).
    """
    from tqdm.auto import tqdm

    from splitinfer.corpora import load_corpus

    named = {b if isinstance(b, Boundary) else str(Boundary.parse(b)): Boundary.parse(b) for b in boundaries}
    if not named:
        raise AttackError("no boundary given; name one or more, e.g. head:2,tail:2")
    _check_args(max_length, max_tokens, batch_size, dtype, 1 << 62, 0)
    depths = {key: b.depth(loaded.num_layers) for key, b in named.items()}
    shown = ",".join(dict.fromkeys(str(b) for b in named.values()))
    dataset = load_corpus(corpus, split, seed, None, loaded.tokenizer)
    plan = plan_sequences(dataset, loaded.tokenizer, max_length, max_tokens, 1 << 62, max_doc_tokens,
                          partial_spans=True)
    if not plan.chunks:
        raise AttackError(f"corpus {corpus!r} split {split!r} yields no tokens; pick a corpus with text")
    rows = list(range(len(plan.chunks)))
    want = sorted(set(depths.values()))
    n = sum(c["length"] for c in plan.chunks)
    with torch.no_grad(), tqdm(total=n, unit="tok", desc=f"taps {corpus} {shown}", disable=not progress,
                               leave=False) as bar:
        states, _ = forward_rows(loaded, TruncatedForward(loaded.model, want[-1]), plan, rows, want, batch_size,
                                 False, dtype, bar)
    docs = [{k: doc[k] for k in ("doc_id", "genre", "text", "pii_spans", "template_spans")} for doc in plan.documents]
    token_ids, offsets = np.concatenate(plan.ids), np.concatenate(plan.offsets)
    lengths, seq_doc = [c["length"] for c in plan.chunks], [c["doc"] for c in plan.chunks]
    log.info("extracted %d tokens of %s at %s", n, corpus, shown.replace(",", ", "))
    return {key: Taps(states[d], token_ids, lengths, seq_doc, docs, offsets, {
        "model": loaded.spec, "model_sha256": loaded.sha256, "boundary": str(named[key]), "depth": d,
        "num_layers": loaded.num_layers, "hidden_size": loaded.hidden_size, "corpus": corpus, "split": split,
        "vocab_size": int(loaded.config.vocab_size), "kind": "teacher-forced", "dtype": dtype, "wire_dtype": dtype})
        for key, d in depths.items()}


def parse_corpora(text: str | Sequence[str]) -> list[str]:
    """``"prose,code"`` -> ``["prose", "code"]`` (a list passes through)."""
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
    if not names:
        raise AttackError("no corpus given; name one or more, e.g. --corpus prose,code,chat,pii")
    return names


def extract_corpora(loaded: Any, corpora: str | Sequence[str], boundary: str | Boundary, split: str | None = None,
                    *, max_tokens: int | None = None, **kwargs: Any) -> list[TapSet]:
    """:func:`extract_taps` for each corpus; ``max_tokens`` is the total, split evenly (remainder to the first)."""
    names = parse_corpora(corpora)
    if max_tokens is not None and max_tokens < len(names):
        raise AttackError(f"max_tokens={max_tokens} is smaller than the number of corpora ({len(names)})")
    budgets = [None] * len(names) if max_tokens is None else [
        max_tokens // len(names) + (1 if i < max_tokens % len(names) else 0) for i in range(len(names))]
    return [extract_taps(loaded, n, boundary, split, max_tokens=m, **kwargs) for n, m in zip(names, budgets)]
