"""In-memory activation taps for the attackers, and a one-pass multi-depth extractor.

:class:`Taps` is what every :class:`~attacks.base.InversionAttack` consumes:
per-token hidden states, token ids and character offsets, with sequences
stored back to back (positions restart at 0 at each sequence) and each
sequence tied to a document (for document-level metrics and bootstrap CIs).
:func:`as_taps` turns an on-disk :class:`~attacks.tapstore.TapSet` (issue 5's
cache), a list of them, or a :class:`Taps` into one :class:`Taps` without
copying the memory-mapped hidden states when it can.

:func:`extract_depths` is an adapter for the per-depth study: it runs ONE
truncated forward to the deepest requested boundary and keeps the states after
every requested depth (forward hooks on the decoder layers), instead of one
forward per boundary as :func:`attacks.taps.extract_taps` does. Tokenization,
chunking (each sequence starts at position 0, no special tokens) and
equal-length batching follow :mod:`attacks.taps`, so the states are the ones
the cloud sees; it additionally caps tokens per document (``max_doc_tokens``)
so that a small token budget still spans many documents. Nothing is cached.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attacks.errors import AttackError

log = logging.getLogger(__name__)

__all__ = ["Taps", "as_taps", "extract_depths"]


@dataclass
class Taps:
    """Hidden states at one boundary for a set of sequences, with their tokens and documents."""

    hidden: np.ndarray  # (N, d) float16 / float32 (may be a read-only memmap)
    token_ids: np.ndarray  # (N,) int64
    seq_lengths: np.ndarray  # (S,) int64; sum == N
    seq_doc: np.ndarray  # (S,) int64 index into ``documents``
    documents: list[dict[str, Any]]  # {doc_id, genre, text, pii_spans, template_spans}
    offsets: np.ndarray | None = None  # (N, 2) int32 char range in the document text
    meta: dict[str, Any] = field(default_factory=dict)  # model, model_sha256, boundary, depth, num_layers, ...

    def __post_init__(self) -> None:
        self.token_ids = np.asarray(self.token_ids, dtype=np.int64).reshape(-1)
        self.seq_lengths = np.asarray(self.seq_lengths, dtype=np.int64).reshape(-1)
        self.seq_doc = np.asarray(self.seq_doc, dtype=np.int64).reshape(-1)
        n = len(self.token_ids)
        if self.hidden.ndim != 2 or self.hidden.shape[0] != n:
            raise AttackError(f"taps hold {n} token ids but hidden states of shape {tuple(self.hidden.shape)}; "
                              "expected (N, d) with one row per token")
        if int(self.seq_lengths.sum()) != n or (self.seq_lengths < 1).any():
            raise AttackError(f"taps sequence lengths sum to {int(self.seq_lengths.sum())}, not {n} tokens (or a "
                              "sequence is empty); rebuild the taps")
        if len(self.seq_doc) != len(self.seq_lengths) or (
                len(self.seq_doc) and (self.seq_doc.min() < 0 or self.seq_doc.max() >= len(self.documents))):
            raise AttackError("taps sequence->document map is inconsistent with the document list; rebuild the taps")
        if self.offsets is not None and self.offsets.shape != (n, 2):
            raise AttackError(f"taps offsets have shape {tuple(self.offsets.shape)}, expected ({n}, 2)")

    # ------------------------------------------------------------ metadata
    @property
    def n_tokens(self) -> int:
        return int(len(self.token_ids))

    @property
    def hidden_size(self) -> int:
        return int(self.hidden.shape[1])

    @property
    def boundary(self) -> str | None:
        return self.meta.get("boundary")

    @property
    def model_sha256(self) -> str | None:
        return self.meta.get("model_sha256")

    def __len__(self) -> int:
        return int(len(self.seq_lengths))

    def __repr__(self) -> str:
        return (f"Taps(boundary={self.boundary}, sequences={len(self)}, tokens={self.n_tokens}, "
                f"documents={len(set(self.seq_doc.tolist()))}, d={self.hidden.shape[1]})")

    # ------------------------------------------------------------ per-token helpers
    def seq_starts(self) -> np.ndarray:
        """(S + 1,) start row of each sequence, then N."""
        return np.concatenate([[0], np.cumsum(self.seq_lengths)]).astype(np.int64)

    def positions(self) -> np.ndarray:
        """(N,) position of each token within its sequence."""
        starts = self.seq_starts()
        return np.arange(self.n_tokens, dtype=np.int64) - np.repeat(starts[:-1], self.seq_lengths)

    def sequence_index(self) -> np.ndarray:
        """(N,) index of each token's sequence."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.seq_lengths)

    def doc_index(self) -> np.ndarray:
        """(N,) index of each token's document in ``documents``."""
        return np.repeat(self.seq_doc, self.seq_lengths)

    def next_token_ids(self, fill: int = -100) -> np.ndarray:
        """(N,) the token after each token in its sequence; ``fill`` at each sequence's last position."""
        nxt = np.full(self.n_tokens, fill, dtype=np.int64)
        nxt[:-1] = self.token_ids[1:]
        nxt[self.seq_starts()[1:] - 1] = fill
        return nxt

    def sequences(self) -> Iterable[tuple[int, slice]]:
        """(sequence index, row slice) for each sequence."""
        starts = self.seq_starts()
        for s in range(len(self)):
            yield s, slice(int(starts[s]), int(starts[s + 1]))

    # ------------------------------------------------------------ subsets
    def select_sequences(self, indices: Sequence[int]) -> Taps:
        """A copy holding only the given sequences (in the given order)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size == 0:
            raise AttackError("cannot select zero sequences from taps: the result would be empty")
        starts = self.seq_starts()
        rows = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in idx])
        return Taps(np.asarray(self.hidden[rows]), self.token_ids[rows], self.seq_lengths[idx], self.seq_doc[idx],
                    self.documents, None if self.offsets is None else self.offsets[rows], dict(self.meta))

    def select_tokens(self, rows: Sequence[int]) -> Taps:
        """A copy holding the given token rows, each as its own one-token sequence (for token-level protocols)."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size == 0:
            raise AttackError("cannot select zero tokens from taps: the result would be empty")
        return Taps(np.asarray(self.hidden[rows]), self.token_ids[rows], np.ones(rows.size, dtype=np.int64),
                    self.doc_index()[rows], self.documents, None if self.offsets is None else self.offsets[rows],
                    dict(self.meta))

    def truncate(self, max_len: int) -> Taps:
        """A copy keeping the first ``max_len`` tokens of every sequence (valid prefixes: positions start at 0)."""
        if max_len < 1:
            raise AttackError(f"max_len={max_len} must be >= 1")
        starts = self.seq_starts()
        lens = np.minimum(self.seq_lengths, max_len)
        rows = np.concatenate([np.arange(starts[i], starts[i] + lens[i]) for i in range(len(self))])
        return Taps(np.asarray(self.hidden[rows]), self.token_ids[rows], lens, self.seq_doc, self.documents,
                    None if self.offsets is None else self.offsets[rows], dict(self.meta))

    def head_tokens(self, max_tokens: int) -> Taps:
        """The first whole sequences holding at most ``max_tokens`` tokens (at least one sequence)."""
        keep = int(np.searchsorted(np.cumsum(self.seq_lengths), max_tokens, side="right"))
        return self if keep >= len(self) else self.select_sequences(range(max(keep, 1)))

    @classmethod
    def concat(cls, parts: Sequence[Taps]) -> Taps:
        """Concatenate taps of the same model and boundary (documents are kept apart)."""
        parts = list(parts)
        if not parts:
            raise AttackError("no taps to concatenate: the corpus list is empty")
        if len(parts) == 1:
            return parts[0]
        for key in ("model_sha256", "boundary"):
            values = {p.meta.get(key) for p in parts}
            if len(values) > 1:
                raise AttackError(f"cannot concatenate taps with different {key}: {sorted(map(str, values))}; "
                                  "extract every corpus with the same model and boundary")
        docs: list[dict[str, Any]] = []
        seq_doc = []
        for p in parts:
            seq_doc.append(p.seq_doc + len(docs))
            docs.extend(p.documents)
        offsets = None if any(p.offsets is None for p in parts) else np.concatenate([p.offsets for p in parts])
        meta = dict(parts[0].meta)
        meta["corpus"] = ",".join(dict.fromkeys(str(p.meta.get("corpus", "?")) for p in parts))
        return cls(np.concatenate([np.asarray(p.hidden) for p in parts]), np.concatenate([p.token_ids for p in parts]),
                   np.concatenate([p.seq_lengths for p in parts]), np.concatenate(seq_doc), docs, offsets, meta)


def _from_tapset(ts: Any) -> Taps:
    """A :class:`Taps` view of an :class:`attacks.tapstore.TapSet` (hidden states stay memory-mapped if contiguous)."""
    chunks = ts.chunks
    if not chunks:
        raise AttackError(f"tap set {ts.path} selects no sequences: the corpus is empty; pick a corpus with text")
    index_docs = ts.index["documents"]
    local: dict[int, int] = {}
    for c in chunks:
        local.setdefault(int(c["doc"]), len(local))
    documents = [{k: index_docs[d].get(k) for k in ("doc_id", "genre", "text", "pii_spans", "template_spans")}
                 for d in local]
    meta = {k: ts.index.get(k) for k in ("model", "model_sha256", "boundary", "depth", "num_layers", "hidden_size",
                                         "corpus", "split", "kind")}
    return Taps(ts.hidden(), ts.token_ids(), [c["length"] for c in chunks], [local[int(c["doc"])] for c in chunks],
                documents, np.asarray(ts.offsets()), meta)


def as_taps(data: Any) -> Taps:
    """:class:`Taps` from a Taps, a TapSet, or a list/tuple of either (concatenated)."""
    if isinstance(data, Taps):
        if data.n_tokens == 0:
            raise AttackError("the taps are empty (0 tokens); pick a corpus with text")
        return data
    if isinstance(data, (list, tuple)):
        return Taps.concat([as_taps(d) for d in data])
    if hasattr(data, "chunks") and hasattr(data, "index") and hasattr(data, "hidden"):
        return _from_tapset(data)
    raise AttackError(f"expected taps (attacks.tapdata.Taps or attacks.tapstore.TapSet), got {type(data).__name__}")


# ---------------------------------------------------------------------------- multi-depth extraction


def _tokenize(dataset: Any, tokenizer: Any, max_length: int, max_tokens: int | None, max_doc_tokens: int | None):
    """Token ids / offsets per sequence, sequence -> document, and the documents (text cut to what is covered)."""
    budget = max_tokens if max_tokens is not None else float("inf")
    seqs: list[tuple[np.ndarray, np.ndarray, int]] = []
    docs: list[dict[str, Any]] = []
    for lo in range(0, len(dataset), 64):
        if budget <= 0:
            break
        rows = dataset[lo: lo + 64]
        enc = tokenizer(rows["text"], add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        for k, text in enumerate(rows["text"]):
            cap = int(min(budget, max_doc_tokens or float("inf"), 1 << 62))
            ids = np.asarray(enc["input_ids"][k], dtype=np.int64)[:cap]  # (n,)
            if ids.size == 0:
                continue
            offs = np.asarray(enc["offset_mapping"][k], dtype=np.int32).reshape(-1, 2)[: ids.size]  # (n, 2)
            budget -= ids.size
            covered = int(offs[:, 1].max())
            spans = [dict(s) for s in rows["pii_spans"][k]] if "pii_spans" in rows else []
            docs.append({"doc_id": rows["doc_id"][k], "genre": rows["genre"][k] if "genre" in rows else "",
                         "text": text[:covered], "pii_spans": [s for s in spans if s["start"] < covered],
                         "template_spans": list(rows["template_spans"][k]) if "template_spans" in rows else []})
            for a in range(0, ids.size, max_length):
                seqs.append((ids[a: a + max_length], offs[a: a + max_length], len(docs) - 1))
            if budget <= 0:
                break
    return seqs, docs


def extract_depths(loaded: Any, corpus: str, boundaries: Sequence[str], split: str | None = None, *,
                   max_tokens: int | None = None, max_length: int = 128, max_doc_tokens: int | None = None,
                   batch_size: int = 8, dtype: str = "fp16", seed: int = 0, progress: bool = True) -> dict[str, Taps]:
    """Hidden states at several boundaries of ``loaded`` for one corpus split, in one truncated forward.

    Returns ``{boundary: Taps}``. ``dtype`` is the stored (wire) precision,
    ``fp16`` like :mod:`attacks.taps` or ``fp32``.
    """
    import torch
    from tqdm.auto import tqdm

    from splitinfer.corpora import load_corpus
    from attacks.taps import Boundary, TruncatedForward, pad_batch, plan_batches

    if dtype not in ("fp16", "fp32"):
        raise AttackError(f"unknown tap dtype {dtype!r}; choose fp16 or fp32")
    bounds = [Boundary.parse(b) for b in boundaries]
    if not bounds:
        raise AttackError("no boundary given; name one or more, e.g. head:2,tail:2")
    depths = {str(b): b.depth(loaded.num_layers) for b in bounds}
    dataset = load_corpus(corpus, split, seed, None, loaded.tokenizer)
    seqs, docs = _tokenize(dataset, loaded.tokenizer, max_length, max_tokens, max_doc_tokens)
    if not seqs:
        raise AttackError(f"corpus {corpus!r} split {split!r} yields no tokens; pick a corpus with text")
    stack = TruncatedForward(loaded.model, max(depths.values()))
    captured: dict[int, Any] = {}
    want = sorted(set(depths.values()))
    hooks = [stack.layers[d - 1].register_forward_hook(
        lambda _m, _i, out, d=d: captured.__setitem__(d, out[0] if isinstance(out, tuple) else out)) for d in want]
    np_dtype = np.float16 if dtype == "fp16" else np.float32
    lengths = [len(s[0]) for s in seqs]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    n = int(starts[-1])
    out = {d: np.empty((n, loaded.hidden_size), dtype=np_dtype) for d in want}  # depth -> (N, d)
    device = next(loaded.model.parameters()).device
    pad_id = int(loaded.tokenizer.pad_token_id or 0)
    try:
        with torch.no_grad(), tqdm(total=n, unit="tok", desc=f"taps {corpus} {','.join(depths)}",
                                   disable=not progress, leave=False) as bar:
            for batch in plan_batches(lengths, batch_size, padded=False):
                stack(pad_batch([seqs[i][0] for i in batch], pad_id).to(device))  # (B, T) -> hooks fill captured
                for d in want:
                    h = captured[d].to(torch.float32).cpu().numpy().astype(np_dtype)  # (B, T, d)
                    for k, i in enumerate(batch):
                        out[d][starts[i]: starts[i + 1]] = h[k, : lengths[i]]
                bar.update(sum(lengths[i] for i in batch))
    finally:
        for h in hooks:
            h.remove()
    token_ids = np.concatenate([s[0] for s in seqs])
    offsets = np.concatenate([s[1] for s in seqs])
    seq_doc = np.array([s[2] for s in seqs], dtype=np.int64)
    result = {}
    for name, d in depths.items():
        meta = {"model": loaded.spec, "model_sha256": loaded.sha256, "boundary": name, "depth": d,
                "num_layers": loaded.num_layers, "hidden_size": loaded.hidden_size, "corpus": corpus,
                "split": split, "vocab_size": int(loaded.config.vocab_size), "kind": "teacher-forced", "dtype": dtype}
        result[name] = Taps(out[d], token_ids, lengths, seq_doc, docs, offsets, meta)
    log.info("extracted %d tokens of %s at %s", n, corpus, ", ".join(depths))
    return result
