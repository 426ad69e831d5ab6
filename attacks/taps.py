"""Activation taps: the hidden states the cloud sees at a split boundary, by truncated forward.

Boundaries are written ``head:A`` or ``tail:B`` (:class:`Boundary`):

- ``head:A``: the states after the first ``A`` decoder layers, i.e. what a
  :class:`~splitinfer.partition.LocalHead` of ``A`` layers sends to the cloud.
- ``tail:B``: the states after the first ``L - B`` layers, i.e. what the cloud
  body returns to a :class:`~splitinfer.partition.LocalTail` of ``B`` layers.

Both must be real split points: ``1 <= A <= L - 2`` and ``1 <= B <= L - 2``
(a split keeps at least one layer in the body and one in each local part).

:class:`TruncatedForward` runs the embedding and only the needed layers, with
the runtime's own layer runner (the model's decoder-layer modules on a fresh
:class:`~splitinfer.kv_cache.PartKVCache`), so batch-1 states are
bit-identical to what ``LocalHead`` sends for the same token ids.
:func:`extract_taps` tokenizes a corpus split (fast tokenizer, character
offsets), cuts documents into sequences of at most ``max_length`` tokens
(each sequence starts at position 0), stops at ``max_tokens``, batches
sequences and writes fp16 shards (:mod:`attacks.tapstore`) under
``cache_dir()/taps/``, keyed by model sha256, corpus manifest, split,
boundary, max length and max tokens. Extraction resumes where it stopped.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attacks.errors import AttackError
from splitinfer.corpora.pii_templates import SPAN_TYPES
from attacks.tapstore import (FORMAT_VERSION, TapSet, pii_label_array, read_index, read_shard_header, shard_name,
                              write_index, write_shard)
from splitinfer.kv_cache import PartKVCache
from splitinfer.partition import _LayerStack

log = logging.getLogger(__name__)

STORE_DTYPES = {"fp16": (torch.float16, np.float16), "fp32": (torch.float32, np.float32)}


@dataclass(frozen=True)
class Boundary:
    """A split boundary: ``head:A`` (what the cloud receives) or ``tail:B`` (what it returns)."""

    side: str  # "head" | "tail"
    layers: int  # A (head layers) or B (tail layers)

    @classmethod
    def parse(cls, text: str | Boundary) -> Boundary:
        """Parse ``"head:A"`` or ``"tail:B"``."""
        if isinstance(text, Boundary):
            return text
        side, sep, n = str(text).strip().partition(":")
        if side not in ("head", "tail") or not sep or not n.strip().isdigit():
            raise AttackError(f"bad boundary {text!r}: write head:A (after A layers, what the cloud receives) or "
                              "tail:B (after L-B layers, what the cloud returns to a B-layer tail), e.g. head:2")
        return cls(side, int(n))

    def validate(self, num_layers: int) -> None:
        """Raise AttackError unless this is a split point of an ``num_layers``-layer model."""
        hi = num_layers - 2
        if not 1 <= self.layers <= hi:
            what = "head layers A" if self.side == "head" else "tail layers B"
            raise AttackError(f"boundary {self} is outside the model: it has {num_layers} layers, so {what} must lie "
                              f"in [1, {hi}] (a split keeps >= 1 layer in the body and in each local part)")

    def depth(self, num_layers: int) -> int:
        """Number of decoder layers run from the embedding to reach this boundary."""
        self.validate(num_layers)
        return self.layers if self.side == "head" else num_layers - self.layers

    def __str__(self) -> str:
        return f"{self.side}:{self.layers}"


class TruncatedForward(_LayerStack):
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
        return self._run_layers(self.embed_tokens(input_ids), positions, PartKVCache(), None)


# ---------------------------------------------------------------------------- planning


@dataclass
class _Plan:
    """Documents, sequences (chunks) and shards of one extraction; per-chunk token arrays."""

    documents: list[dict[str, Any]]
    chunks: list[dict[str, Any]]
    shards: list[dict[str, Any]]
    pii_types: list[str]
    ids: list[np.ndarray]  # per chunk (T,) int32
    offsets: list[np.ndarray]  # per chunk (T, 2) int32
    labels: list[np.ndarray]  # per chunk (T,) int16


def plan_sequences(dataset: Any, tokenizer: Any, max_length: int, max_tokens: int | None,
                   shard_tokens: int) -> _Plan:
    """Tokenize documents (no special tokens, with offsets), cut them into sequences, assign shards.

    Documents are taken in split order until ``max_tokens``; the last one is
    cut. A document's stored ``text`` and ``pii_spans`` cover only its
    tokenized part (spans that end beyond it are left out).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise AttackError("taps need a fast (Rust) tokenizer for character offsets; load the model with its "
                          "tokenizer.json")
    # every set labels the synthetic corpus's span types the same way (+ any other types present, sorted)
    types = list(SPAN_TYPES) + sorted({s["type"] for spans in dataset["pii_spans"] for s in spans} - set(SPAN_TYPES))
    budget = max_tokens if max_tokens is not None else float("inf")
    plan = _Plan([], [], [], types, [], [], [])
    lo, seen_docs, seen_tokens = 0, 0, 0
    while lo < len(dataset) and budget > 0:
        # tokenize only about as many documents as the remaining budget needs (estimated from those seen)
        per_doc = seen_tokens / seen_docs if seen_docs else 0
        n = 64 if budget == float("inf") else 1 if not per_doc else int(min(64, max(1, -(-budget // per_doc))))
        rows = dataset[lo : lo + n]
        lo += n
        enc = tokenizer(rows["text"], add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        for k, text in enumerate(rows["text"]):
            seen_docs, seen_tokens = seen_docs + 1, seen_tokens + len(enc["input_ids"][k])
            ids = np.asarray(enc["input_ids"][k], dtype=np.int32)[: int(min(budget, 1 << 62))]  # (n,)
            if ids.size == 0:
                log.info("document %s has no tokens; skipped", rows["doc_id"][k])
                continue
            offs = np.asarray(enc["offset_mapping"][k], dtype=np.int32).reshape(-1, 2)[: ids.size]  # (n, 2)
            budget -= ids.size
            d = len(plan.documents)
            spans = list(rows["pii_spans"][k])
            labels = pii_label_array(offs, spans, types)  # (n,)
            first_chunk = len(plan.chunks)
            for j, a in enumerate(range(0, ids.size, max_length)):
                b = min(a + max_length, ids.size)
                plan.chunks.append({"doc": d, "chunk": j, "length": b - a, "char_start": int(offs[a:b, 0].min()),
                                    "char_end": int(offs[a:b, 1].max())})
                plan.ids.append(ids[a:b])
                plan.offsets.append(offs[a:b])
                plan.labels.append(labels[a:b])
            covered = int(offs[:, 1].max())
            plan.documents.append({"doc_id": rows["doc_id"][k], "group_id": rows["group_id"][k],
                                   "genre": rows["genre"][k], "split": rows["split"][k], "text": text[:covered],
                                   "pii_spans": [s for s in spans if s["end"] <= covered],
                                   "template_spans": list(rows.get("template_spans", [[]] * (k + 1))[k]),
                                   "n_tokens": int(ids.size), "chunks": list(range(first_chunk, len(plan.chunks)))})
            if budget <= 0:
                break
    shard_fill = shard_tokens  # start a new shard on the first chunk
    for c in plan.chunks:
        if shard_fill + c["length"] > shard_tokens and shard_fill > 0:
            plan.shards.append({"file": shard_name(len(plan.shards)), "n_tokens": 0})
            shard_fill = 0
        c["shard"], c["start"] = len(plan.shards) - 1, shard_fill
        shard_fill += c["length"]
        plan.shards[-1]["n_tokens"] = shard_fill
    return plan


def plan_batches(lengths: Sequence[int], batch_size: int, padded: bool = False) -> list[list[int]]:
    """Group sequence indices into batches of at most ``batch_size``.

    Exact mode (default): only equal lengths share a batch, so no padding is
    needed. Padded mode: indices sorted by length (longest first) and cut in
    order, which keeps the padding small. Deterministic.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    if padded:
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    batches: list[list[int]] = []
    for i in order:
        if batches and len(batches[-1]) < batch_size and lengths[batches[-1][0]] == lengths[i]:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def pad_batch(seqs: Sequence[np.ndarray], pad_id: int) -> torch.Tensor:
    """Right-pad token id arrays into a (B, T) int64 tensor."""
    out = np.full((len(seqs), max(len(s) for s in seqs)), pad_id, dtype=np.int64)  # (B, T)
    for b, s in enumerate(seqs):
        out[b, : len(s)] = s
    return torch.from_numpy(out)


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
    old = _existing_index(directory, key_fields)
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


def _existing_index(directory: Path, key_fields: dict[str, Any]) -> dict[str, Any] | None:
    if not (directory / "index.json").is_file():
        return None
    try:
        index = read_index(directory)
    except AttackError as e:
        log.warning("ignoring unreadable tap index in %s: %s", directory, e)
        return None
    return index if index.get("key") == key_fields else None


def _shard_done(path: Path, n_tokens: int, hidden_size: int) -> bool:
    if not path.is_file():
        return False
    try:
        header = read_shard_header(path)
    except AttackError:
        return False
    return header.get("hidden", {}).get("shape") == [n_tokens, hidden_size]


def _run_shards(loaded: Any, stack: TruncatedForward, plan: _Plan, directory: Path, batch_size: int, padded: bool,
                dtype: str, desc: str, progress: bool, on_shard: Callable[[int], None] | None) -> tuple[int, float]:
    """Compute and write every shard of ``plan`` whose file does not exist yet.

    Returns the tokens computed and the CPU seconds spent inside the forward itself.
    """
    from tqdm.auto import tqdm

    torch_dtype, np_dtype = STORE_DTYPES[dtype]
    device = next(loaded.model.parameters()).device
    pad_id = int(loaded.tokenizer.pad_token_id or 0)
    d = loaded.hidden_size
    rows_of: list[list[int]] = [[] for _ in plan.shards]
    for i, c in enumerate(plan.chunks):
        rows_of[c["shard"]].append(i)
    todo = [s for s, e in enumerate(plan.shards) if not _shard_done(directory / e["file"], e["n_tokens"], d)]
    total = sum(e["n_tokens"] for e in plan.shards)
    done = total - sum(plan.shards[s]["n_tokens"] for s in todo)
    if done:
        log.info("resuming %s: %d of %d shards already written", directory, len(plan.shards) - len(todo),
                 len(plan.shards))
    forward_cpu = 0.0
    with tqdm(total=total, initial=done, unit="tok", desc=desc, disable=not progress, leave=False) as bar:
        for s in todo:
            rows = rows_of[s]
            hidden = np.empty((plan.shards[s]["n_tokens"], d), dtype=np_dtype)  # (N, d)
            for batch in plan_batches([plan.chunks[i]["length"] for i in rows], batch_size, padded):
                idx = [rows[j] for j in batch]
                ids = pad_batch([plan.ids[i] for i in idx], pad_id).to(device)  # (B, T)
                c0 = time.process_time()
                out = stack(ids)  # (B, T, d)
                forward_cpu += time.process_time() - c0
                out = out.to(torch_dtype).cpu().numpy()
                for k, i in enumerate(idx):
                    c = plan.chunks[i]
                    hidden[c["start"] : c["start"] + c["length"]] = out[k, : c["length"]]
                bar.update(sum(plan.chunks[i]["length"] for i in idx))
            write_shard(directory / plan.shards[s]["file"], {
                "hidden": hidden,
                "token_ids": np.concatenate([plan.ids[i] for i in rows]),
                "positions": np.concatenate([np.arange(plan.chunks[i]["length"], dtype=np.int32) for i in rows]),
                "offsets": np.concatenate([plan.offsets[i] for i in rows]),
                "pii_labels": np.concatenate([plan.labels[i] for i in rows]),
            })
            log.debug("wrote %s", plan.shards[s]["file"])
            if on_shard is not None:
                on_shard(s)
    return total - done, forward_cpu


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
