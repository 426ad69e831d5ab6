"""Which tokens an extraction computes, and in which batches: tokenization, sequences, shards.

:func:`plan_sequences` tokenizes a corpus split with the model's fast tokenizer
as it does by default (:mod:`splitinfer.tokens`: its BOS where it adds one; character
offsets), cuts documents into sequences of at most ``max_length`` tokens (each
starts at position 0 with the tokenizer's prefix, as a split client's prompt does) and assigns them to shards of the on-disk store (:mod:`attacks.tapstore`).
:func:`plan_batches` groups sequences for the truncated forward of
:mod:`attacks.taps`: equal lengths only (no padding, exact), or sorted and
right-padded (``padded``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attacks.errors import AttackError
from splitinfer.corpora.pii_templates import SPAN_TYPES
from splitinfer.tokens import added_tokens, encode_texts
from attacks.tapstore import pii_label_array, shard_name

log = logging.getLogger(__name__)


@dataclass
class Plan:
    """Documents, sequences (chunks) and shards of one extraction; per-chunk token arrays."""

    documents: list[dict[str, Any]]
    chunks: list[dict[str, Any]]
    shards: list[dict[str, Any]]
    pii_types: list[str]
    ids: list[np.ndarray]  # per chunk (T,) int32
    offsets: list[np.ndarray]  # per chunk (T, 2) int32
    labels: list[np.ndarray]  # per chunk (T,) int16


def plan_sequences(dataset: Any, tokenizer: Any, max_length: int, max_tokens: int | None, shard_tokens: int,
                   max_doc_tokens: int | None = None, partial_spans: bool = False) -> Plan:
    """Tokenize documents (the model's default special tokens, with offsets), cut them into sequences, assign shards.

    Every sequence starts with the tokenizer's prefix (a BOS where it adds one; offsets (0, 0), a public
    position): a document's later sequences get it too, so no sequence runs off the model's input distribution.

    Documents are taken in split order until ``max_tokens``; the last one is
    cut, and so is every document longer than ``max_doc_tokens`` (so a small
    budget still spans many documents). A document's stored ``text`` and
    ``pii_spans`` cover only its tokenized part: spans that end beyond it are
    left out, or with ``partial_spans`` kept when they start inside it (what
    the in-memory taps of :func:`attacks.taps.extract_depths` have always kept).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise AttackError("taps need a fast (Rust) tokenizer for character offsets; load the model with its "
                          "tokenizer.json")
    # every set labels the synthetic corpus's span types the same way (+ any other types present, sorted)
    types = list(SPAN_TYPES) + sorted({s["type"] for spans in dataset["pii_spans"] for s in spans} - set(SPAN_TYPES))
    budget = max_tokens if max_tokens is not None else float("inf")
    prefix = np.asarray(added_tokens(tokenizer)[0], dtype=np.int32)  # (p,) the BOS, where the tokenizer adds one
    if max_length <= len(prefix):
        raise AttackError(f"max_length={max_length} leaves no room for text after the tokenizer's {len(prefix)} "
                          "special token(s); raise max_length")
    plan = Plan([], [], [], types, [], [], [])
    lo, seen_docs, seen_tokens = 0, 0, 0
    while lo < len(dataset) and budget > 0:
        # tokenize only about as many documents as the remaining budget needs (estimated from those seen)
        per_doc = seen_tokens / seen_docs if seen_docs else 0
        n = 64 if budget == float("inf") else 1 if not per_doc else int(min(64, max(1, -(-budget // per_doc))))
        rows = dataset[lo : lo + n]
        lo += n
        encs = encode_texts(tokenizer, list(rows["text"]))
        for k, text in enumerate(rows["text"]):
            seen_docs, seen_tokens = seen_docs + 1, seen_tokens + len(encs[k])
            cap = int(min(budget, max_doc_tokens or float("inf"), 1 << 62))
            ids = np.asarray(encs[k].ids, dtype=np.int32)[:cap]  # (n,)
            if ids.size <= len(prefix):
                log.info("document %s has no tokens; skipped", rows["doc_id"][k])
                continue
            offs = np.asarray(encs[k].offsets, dtype=np.int32).reshape(-1, 2)[: ids.size]  # (n, 2)
            d = len(plan.documents)
            spans = list(rows["pii_spans"][k])
            first_chunk, n_tokens = len(plan.chunks), 0
            for j, (c_ids, c_offs) in enumerate(_chunks(ids, offs, max_length, prefix)):
                plan.chunks.append({"doc": d, "chunk": j, "length": len(c_ids), "char_start": int(c_offs[:, 0].min()),
                                    "char_end": int(c_offs[:, 1].max())})
                plan.ids.append(c_ids)
                plan.offsets.append(c_offs)
                plan.labels.append(pii_label_array(c_offs, spans, types))  # (t,)
                n_tokens += len(c_ids)
            budget -= n_tokens
            covered = int(offs[:, 1].max())
            plan.documents.append({"doc_id": rows["doc_id"][k], "group_id": rows["group_id"][k],
                                   "genre": rows["genre"][k], "split": rows["split"][k], "text": text[:covered],
                                   "pii_spans": [s for s in spans if (s["start"] < covered if partial_spans
                                                                      else s["end"] <= covered)],
                                   "template_spans": list(rows.get("template_spans", [[]] * (k + 1))[k]),
                                   "n_tokens": n_tokens, "chunks": list(range(first_chunk, len(plan.chunks)))})
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


def _chunks(ids: np.ndarray, offs: np.ndarray, max_length: int, prefix: np.ndarray):
    """``(ids, offsets)`` pieces of one document of at most ``max_length`` tokens, each starting with ``prefix``.

    ``ids`` (n,) already starts with the prefix; a later piece gets it again at offsets (0, 0)."""
    p = len(prefix)
    has_prefix = p > 0 and np.array_equal(ids[:p], prefix)
    body_ids, body_offs = (ids[p:], offs[p:]) if has_prefix else (ids, offs)
    step = max_length - (p if has_prefix else 0)
    for a in range(0, len(body_ids), step):
        c_ids, c_offs = body_ids[a: a + step], body_offs[a: a + step]  # (t,), (t, 2)
        if has_prefix:
            c_ids = np.concatenate([prefix, c_ids]).astype(np.int32)
            c_offs = np.concatenate([np.zeros((p, 2), dtype=np.int32), c_offs]).astype(np.int32)
        yield c_ids, c_offs


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
