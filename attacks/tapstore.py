"""On-disk format of activation taps, and :class:`TapSet`, the memory-mapped reader.

A tap set is a directory::

    index.json                 what, where, provenance (below); "complete": true once every shard exists
    shard-00000.safetensors    per-token arrays of consecutive sequences, back to back
    shard-00001.safetensors    ...

Per-token arrays in every shard (``N`` tokens of the shard):

- ``hidden``     (N, d) float16 (or float32): hidden states at the boundary
- ``token_ids``  (N,)   int32: the token each row belongs to
- ``positions``  (N,)   int32: the token's position id in its sequence
- ``offsets``    (N, 2) int32: the token's character range in its document's ``text`` (-1, -1 if unknown)
- ``pii_labels`` (N,)   int16: 0 outside PII, else 1 + index into ``index["pii_types"]`` (the
  synthetic corpus's span types in :data:`splitinfer.corpora.pii_templates.SPAN_TYPES` order, then any others)

plus, for wire taps (:mod:`attacks.wiretap`), ``parents`` (N,) int32 (the
frame's parent array, -2 where the frame had none) and ``kept`` (N,) int8
(1 if the token's KV entry was committed, 0 if its draft was rejected).

``index.json`` holds ``documents`` (doc_id, group_id, genre, split, text,
pii_spans, chunks), ``chunks`` (one per sequence: doc, chunk, shard, start,
length, char_start, char_end; wire taps add session/step/keep), ``shards``
(file, n_tokens), the cache ``key`` and provenance (model, model_sha256,
corpus, split, boundary, depth, ...). Shards are written to a temporary name
and renamed, so a shard file that exists is complete; that is what makes
extraction resumable. Nothing is pickled: shards are safetensors and loading
maps them with :class:`numpy.memmap` (no copy until a slice is concatenated).
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attacks.errors import AttackError
from splitinfer.atomic import atomic_file, write_json

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
INDEX_NAME = "index.json"
TOKEN_FIELDS = ("hidden", "token_ids", "positions", "offsets", "pii_labels")
_ST_DTYPES = {"F16": np.float16, "F32": np.float32, "BF16": None, "I8": np.int8, "I16": np.int16,
              "I32": np.int32, "I64": np.int64, "U8": np.uint8, "BOOL": np.bool_}


def shard_name(i: int) -> str:
    """File name of shard ``i``."""
    return f"shard-{i:05d}.safetensors"


def write_shard(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write one shard atomically (temporary file + fsync + rename)."""
    from safetensors.numpy import save_file

    with atomic_file(path) as tmp:
        save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(tmp),
                  metadata={"format": "splitinfer-taps"})


def _bad_shard(path: Path, why: str) -> AttackError:
    return AttackError(f"tap shard {path} is unreadable or not a safetensors file ({why}); delete it and re-extract")


def read_shard_header(path: Path) -> dict[str, dict[str, Any]]:
    """The checked safetensors header of a shard: ``{name: {dtype, shape, data_offsets}}`` (no tensor data read).

    Every entry must name a known dtype, a shape and offsets that fit the file; anything else is one
    :class:`AttackError` naming the shard and the fix.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            (hlen,) = struct.unpack("<Q", f.read(8))
            if hlen > min(size, 100 * 2**20):
                raise ValueError(f"header length {hlen} is implausible")
            header = json.loads(f.read(hlen))
    except (OSError, ValueError, struct.error) as e:
        raise _bad_shard(path, str(e)[:120]) from None
    if not isinstance(header, dict):
        raise _bad_shard(path, "its header is not a JSON object")
    header.pop("__metadata__", None)
    for name, spec in header.items():
        ok = isinstance(spec, dict) and spec.get("dtype") in _ST_DTYPES and isinstance(spec.get("shape"), list) \
            and all(isinstance(n, int) and n >= 0 for n in spec["shape"]) \
            and isinstance(spec.get("data_offsets"), list) and len(spec["data_offsets"]) == 2 \
            and all(isinstance(n, int) for n in spec["data_offsets"])
        if not ok:
            raise _bad_shard(path, f"bad header entry {name[:40]!r}")
        begin, end = spec["data_offsets"]
        itemsize = np.dtype(_ST_DTYPES[spec["dtype"]] or np.uint16).itemsize
        if not 0 <= begin <= end or end - begin != itemsize * int(np.prod(spec["shape"])) or 8 + hlen + end > size:
            raise _bad_shard(path, f"array {name[:40]!r} does not fit the file (truncated?)")
    header["__data_start__"] = 8 + hlen
    return header


def memmap_shard(path: Path) -> dict[str, np.ndarray]:
    """Every array of a shard as a read-only :class:`numpy.memmap` (zero-copy)."""
    header = read_shard_header(path)
    start = header.pop("__data_start__")
    out = {}
    for name, spec in header.items():
        dtype = _ST_DTYPES.get(spec["dtype"])
        if dtype is None:
            raise AttackError(f"tap shard {path} holds {name!r} as {spec['dtype']}, which taps do not use")
        begin, end = spec["data_offsets"]
        shape = tuple(spec["shape"])
        if end == begin:
            out[name] = np.zeros(shape, dtype=dtype)
        else:
            out[name] = np.memmap(path, dtype=dtype, mode="r", offset=start + begin, shape=shape)
    return out


def write_index(directory: Path, index: dict[str, Any]) -> None:
    """Write ``index.json`` atomically."""
    write_json(directory / INDEX_NAME, index, separators=(",", ":"), default=str)


def shard_path(directory: Path, entry: Any) -> Path:
    """The file of a shard entry of ``index.json``: a plain file name inside ``directory``, nothing else."""
    name = entry.get("file") if isinstance(entry, dict) else None
    if not isinstance(name, str) or not name or name in (".", "..") or Path(name).name != name or "\\" in name:
        raise AttackError(f"{Path(directory) / INDEX_NAME} names a shard file {str(name)[:60]!r} outside the tap "
                          "directory; the index is corrupt or forged: delete the directory and re-extract")
    return Path(directory) / name


def read_index(directory: Path) -> dict[str, Any]:
    """Read and sanity-check ``index.json`` of a tap directory (shard files must lie inside it)."""
    path = Path(directory) / INDEX_NAME
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AttackError(f"{directory} is not a tap set (no {INDEX_NAME}); extract taps first") from None
    except (OSError, ValueError) as e:
        raise AttackError(f"cannot read {path}: {e}; delete the directory and re-extract") from None
    if not isinstance(index, dict) or index.get("format_version") != FORMAT_VERSION:
        got = index.get("format_version") if isinstance(index, dict) else None
        raise AttackError(f"{path} has tap format version {got!r}; this code reads {FORMAT_VERSION}; "
                          "re-extract the taps")
    shards = index.get("shards", [])
    if not isinstance(shards, list):
        raise AttackError(f"{path} has a malformed shard list; delete the directory and re-extract")
    for entry in shards:
        shard_path(directory, entry)
    return index


@dataclass
class TapSequence:
    """One sequence (a document chunk, or one wire frame) of a tap set; arrays are memory-mapped views."""

    index: int  # chunk index in the tap set
    doc_id: str
    chunk: int  # chunk number within the document (wire taps: step number)
    hidden: np.ndarray  # (T, d)
    token_ids: np.ndarray  # (T,)
    positions: np.ndarray  # (T,)
    offsets: np.ndarray  # (T, 2) char range in the document text
    pii_labels: np.ndarray  # (T,)
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # e.g. parents, kept (wire taps)
    meta: dict[str, Any] = field(default_factory=dict)  # the chunk's index entry


@dataclass
class TapDocument:
    """All tokens of one document (its chunks concatenated), for document-level metrics."""

    doc_id: str
    genre: str
    text: str
    pii_spans: list[dict[str, Any]]
    hidden: np.ndarray  # (n, d)
    token_ids: np.ndarray  # (n,)
    offsets: np.ndarray  # (n, 2) char range in ``text``
    pii_labels: np.ndarray  # (n,)
    chunk_lengths: list[int]  # tokens per chunk, in order (positions restart at each chunk)


class TapSet:
    """A (view of a) tap set on disk: iterate sequences or documents, or get concatenated arrays.

    ``TapSet(path)`` opens a complete tap set; ``select`` / ``select_documents``
    / ``split`` return views on a subset of its sequences without copying.
    Array methods return per-token arrays concatenated over the selected
    sequences in order; they are memory-mapped views when the selection is one
    contiguous run within one shard, and fresh arrays otherwise.
    """

    def __init__(self, path: str | Path, chunks: Sequence[int] | None = None, *, _index: dict | None = None,
                 _shards: list | None = None):
        self.path = Path(path)
        self.index = _index if _index is not None else read_index(self.path)
        if not self.index.get("complete"):
            raise AttackError(f"tap set {self.path} is incomplete (extraction was interrupted); rerun the same "
                              "extraction to resume it")
        n_chunks = len(self.index["chunks"])
        self._sel = np.arange(n_chunks) if chunks is None else np.asarray(chunks, dtype=np.int64)
        if self._sel.size and (self._sel.min() < 0 or self._sel.max() >= n_chunks):
            raise AttackError(f"chunk indices must lie in [0, {n_chunks}) for tap set {self.path}")
        self._shards = _shards if _shards is not None else [None] * len(self.index["shards"])

    # ------------------------------------------------------------ metadata
    @property
    def boundary(self) -> str:
        return self.index["boundary"]

    @property
    def hidden_size(self) -> int:
        return int(self.index["hidden_size"])

    @property
    def pii_types(self) -> list[str]:
        return list(self.index["pii_types"])

    @property
    def chunks(self) -> list[dict[str, Any]]:
        """Index entries of the selected sequences."""
        return [self.index["chunks"][i] for i in self._sel]

    @property
    def n_tokens(self) -> int:
        return int(sum(c["length"] for c in self.chunks))

    @property
    def doc_ids(self) -> list[str]:
        """Distinct document ids of the selection, in order of first appearance."""
        docs = self.index["documents"]
        return list(dict.fromkeys(docs[c["doc"]]["doc_id"] for c in self.chunks))

    def __len__(self) -> int:
        return int(self._sel.size)

    def __repr__(self) -> str:
        return (f"TapSet({str(self.path)!r}, boundary={self.boundary}, sequences={len(self)}, "
                f"tokens={self.n_tokens}, d={self.hidden_size})")

    # ------------------------------------------------------------ shards
    def shard(self, i: int) -> dict[str, np.ndarray]:
        """Memory-mapped arrays of shard ``i`` (opened on first use)."""
        if self._shards[i] is None:
            entry = self.index["shards"][i]
            path = shard_path(self.path, entry)
            if not path.is_file():
                raise AttackError(f"tap shard {path} is missing; re-extract the taps")
            arrays = memmap_shard(path)
            if len(arrays.get("hidden", ())) != entry["n_tokens"]:
                raise AttackError(f"tap shard {path} holds {len(arrays.get('hidden', ()))} tokens, the index says "
                                  f"{entry['n_tokens']}; delete {self.path} and re-extract")
            self._shards[i] = arrays
        return self._shards[i]

    def _view(self, chunks: Sequence[int]) -> TapSet:
        return TapSet(self.path, chunks, _index=self.index, _shards=self._shards)

    # ------------------------------------------------------------ iteration
    def sequence(self, i: int) -> TapSequence:
        """The ``i``-th selected sequence."""
        c = self.index["chunks"][int(self._sel[i])]
        arrays = self.shard(c["shard"])
        rows = slice(c["start"], c["start"] + c["length"])
        extra = {k: v[rows] for k, v in arrays.items() if k not in TOKEN_FIELDS}
        doc = self.index["documents"][c["doc"]]
        return TapSequence(int(self._sel[i]), doc["doc_id"], c["chunk"], arrays["hidden"][rows],
                           arrays["token_ids"][rows], arrays["positions"][rows], arrays["offsets"][rows],
                           arrays["pii_labels"][rows], extra, c)

    def __iter__(self) -> Iterator[TapSequence]:
        for i in range(len(self)):
            yield self.sequence(i)

    def documents(self) -> Iterator[TapDocument]:
        """Selected tokens grouped by document (chunks of a document concatenated in order)."""
        groups: dict[int, list[TapSequence]] = {}
        for seq in self:
            groups.setdefault(seq.meta["doc"], []).append(seq)
        for d, seqs in groups.items():
            doc = self.index["documents"][d]
            cat = lambda name: np.concatenate([getattr(s, name) for s in seqs])  # noqa: E731
            yield TapDocument(doc["doc_id"], doc.get("genre", ""), doc.get("text", ""), list(doc.get("pii_spans", [])),
                              cat("hidden"), cat("token_ids"), cat("offsets"), cat("pii_labels"),
                              [len(s.token_ids) for s in seqs])

    # ------------------------------------------------------------ arrays
    def array(self, name: str, dtype: Any = None) -> np.ndarray:
        """Per-token array ``name`` over the selection, concatenated: (N, ...)."""
        runs: list[tuple[int, int, int]] = []  # (shard, start, stop), merged where contiguous
        for c in self.chunks:
            s, a, b = c["shard"], c["start"], c["start"] + c["length"]
            if runs and runs[-1][0] == s and runs[-1][2] == a:
                runs[-1] = (s, runs[-1][1], b)
            else:
                runs.append((s, a, b))
        if name not in self.shard(runs[0][0] if runs else 0):
            raise AttackError(f"tap set {self.path} has no per-token array {name!r}")
        if not runs:
            like = self.shard(0)[name]
            return np.zeros((0, *like.shape[1:]), dtype=dtype or like.dtype)
        parts = [self.shard(s)[name][a:b] for s, a, b in runs]
        out = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return out if dtype is None else out.astype(dtype, copy=False)

    def hidden(self, dtype: Any = None) -> np.ndarray:
        """(N, d) hidden states (stored dtype unless ``dtype`` is given)."""
        return self.array("hidden", dtype)

    def token_ids(self) -> np.ndarray:
        """(N,) int64 token ids."""
        return self.array("token_ids", np.int64)

    def pii_labels(self) -> np.ndarray:
        """(N,) int16: 0 outside PII, else 1 + index into :attr:`pii_types`."""
        return self.array("pii_labels")

    def offsets(self) -> np.ndarray:
        """(N, 2) int32 character ranges in each token's document text."""
        return self.array("offsets")

    def positions(self) -> np.ndarray:
        """(N,) int32 position ids."""
        return self.array("positions")

    def doc_index(self) -> np.ndarray:
        """(N,) int32 index of each token's document in ``index["documents"]``."""
        chunks = self.chunks
        return np.repeat(np.array([c["doc"] for c in chunks], dtype=np.int32), [c["length"] for c in chunks])

    def sequence_index(self) -> np.ndarray:
        """(N,) int32 index of each token's sequence within this selection (0 .. len(self) - 1)."""
        return np.repeat(np.arange(len(self), dtype=np.int32), [c["length"] for c in self.chunks])

    # ------------------------------------------------------------ subsets
    def select(self, indices: Sequence[int]) -> TapSet:
        """A view on the selected sequences ``indices`` (positions within this view)."""
        return self._view(self._sel[np.asarray(indices, dtype=np.int64)])

    def select_documents(self, doc_ids: Sequence[str]) -> TapSet:
        """A view on the sequences of the given documents (in this view's order)."""
        want = set(doc_ids)
        docs = self.index["documents"]
        return self._view([i for i in self._sel if docs[self.index["chunks"][i]["doc"]]["doc_id"] in want])

    def split(self, test_fraction: float = 0.2, seed: int = 0) -> tuple[TapSet, TapSet]:
        """(train, test) views split by document group (no document in both), seeded."""
        from splitinfer.corpora import split_documents

        if not 0.0 < test_fraction < 1.0:
            raise AttackError(f"test_fraction={test_fraction!r} must lie strictly between 0 and 1")
        docs = self.index["documents"]
        ids = self.doc_ids
        groups = {d["doc_id"]: d.get("group_id") or d["doc_id"] for d in docs}
        parts = split_documents(ids, seed, (1.0 - test_fraction, 0.0, test_fraction), groups)
        return self.select_documents(parts["train"]), self.select_documents(parts["test"])


def matching_index(directory: Path, key_fields: dict[str, Any]) -> dict[str, Any] | None:
    """The index of the tap set in ``directory`` if its cache key is ``key_fields`` (else None)."""
    if not (directory / "index.json").is_file():
        return None
    try:
        index = read_index(directory)
    except AttackError as e:
        log.warning("ignoring unreadable tap index in %s: %s", directory, e)
        return None
    return index if index.get("key") == key_fields else None


def shard_complete(path: Path, n_tokens: int, hidden_size: int) -> bool:
    """True when the shard file at ``path`` exists and holds ``n_tokens`` rows of ``hidden_size`` states."""
    if not path.is_file():
        return False
    try:
        header = read_shard_header(path)
    except AttackError:
        return False
    return header.get("hidden", {}).get("shape") == [n_tokens, hidden_size]


def pii_label_array(offsets: np.ndarray, spans: Sequence[dict[str, Any]], types: Sequence[str]) -> np.ndarray:
    """(T,) int16 PII label per token: 1 + index of the first span type whose span overlaps the token."""
    offsets = np.asarray(offsets).reshape(-1, 2)  # (T, 2)
    labels = np.zeros(len(offsets), dtype=np.int16)
    starts, ends = offsets[:, 0], offsets[:, 1]
    real = ends > starts
    code = {t: i + 1 for i, t in enumerate(types)}
    for s in spans:
        hit = real & (starts < s["end"]) & (ends > s["start"]) & (labels == 0)
        labels[hit] = code[s["type"]]
    return labels
