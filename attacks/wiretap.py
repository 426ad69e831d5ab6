"""Wire taps: record exactly what the cloud receives and returns during real split generation.

:class:`TapLink` wraps any :class:`~splitinfer.link.Link`. Every frame still
goes through the wrapped link unchanged (its WAN emulation and byte counts
apply); the tap decodes copies of the frames with the protocol's own decoder
and keeps, per ``forward`` round trip, the hidden states the cloud received,
their positions, the draft's parent array and ``keep`` field, and the hidden
states the cloud returned. ``keep`` / ``crop`` fields (in forward and commit
frames) tell which draft tokens were committed, as the cloud learns it.

:class:`WireTap` attaches a TapLink to a :class:`~splitinfer.client.SplitModel`
and labels each frame with the token ids the local head embedded (client-side
knowledge, used only to score attackers), maps sessions to documents, and
:meth:`WireTap.save` writes two tap sets in the on-disk format of
:mod:`attacks.tapstore`: ``head-A`` (what the cloud received) and ``tail-B``
(what it returned), with the extra per-token arrays ``parents`` (-2 where the
frame had no parent array, i.e. a causal chain) and ``kept``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attacks.boundary import Boundary
from attacks.errors import AttackError
from attacks.taps import STORE_DTYPES, taps_root
from attacks.tapstore import FORMAT_VERSION, TapSet, pii_label_array, shard_name, write_index, write_shard
from splitinfer.corpora.pii_templates import SPAN_TYPES
from splitinfer.errors import ProtocolError
from splitinfer.link import Link
from splitinfer.protocol import decode_frame

log = logging.getLogger(__name__)


@dataclass
class WireStep:
    """One forward round trip as the cloud saw it."""

    session: str
    step: int  # forward number within the session
    positions: list[int]
    parents: list[int] | None  # None: a causal chain (no parent array on the wire)
    keep: dict | None  # commit of the previous step carried by this frame
    sent: torch.Tensor  # (T, d) hidden states the cloud received, wire dtype
    returned: torch.Tensor | None  # (T, d) hidden states the cloud returned; None if it refused
    kept: list[bool] = field(default_factory=list)  # per token: still committed after later keep/crop
    token_ids: list[int] | None = None  # client-side labels (never on the wire)


class TapLink(Link):
    """A Link that records the forward traffic of the link it wraps (see the module docstring)."""

    def __init__(self, inner: Link, labels: Callable[[int], list[int] | None] | None = None):
        super().__init__()  # no WAN of its own: the inner link emulates the network
        self.inner = inner
        self.labels = labels  # called with T for each forward frame; returns the T token ids or None
        self.steps: list[WireStep] = []
        self.commits: list[dict] = []  # commit frames: {"session", "keep", "crop"}
        self._live: dict[str, list[tuple[int, int]]] = {}  # session -> (step index, token) per cloud cache entry
        self._count: dict[str, int] = {}

    def _exchange(self, frame: bytes) -> bytes:
        reply = self.inner.request(frame)
        try:
            self._record(frame, reply)
        except ProtocolError as e:  # a malformed frame is the runtime's problem, not the tap's
            log.warning("wire tap could not decode a frame: %s", e)
        return reply

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        """Everything else (``reconnect``, ``reconnectable``, ``token``, ...) is the wrapped link's."""
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    # ------------------------------------------------------------ recording
    def _record(self, frame: bytes, reply: bytes) -> None:
        req = decode_frame(frame)
        if req.op not in ("forward", "commit"):
            return
        rep = decode_frame(reply)
        sid = req.fields["session"]
        live = self._live.setdefault(sid, [])
        ok = rep.op in ("result", "committed")
        if ok and req.fields.get("keep") is not None:
            self._apply_keep(live, req.fields["keep"])
        if req.op == "commit":
            self.commits.append({"session": sid, "keep": req.fields.get("keep"), "crop": req.fields.get("crop")})
            if ok and isinstance(req.fields.get("crop"), int):
                self._drop(live[req.fields["crop"] :])
                del live[req.fields["crop"] :]
            return
        sent = req.tensors["hidden"][0]  # (T, d)
        returned = rep.tensors["hidden"][0] if rep.op == "result" and "hidden" in rep.tensors else None  # (T, d)
        n = self._count.get(sid, 0)
        self._count[sid] = n + 1
        t = int(sent.shape[0])
        labels = self.labels(t) if self.labels is not None else None
        step = WireStep(sid, n, list(req.fields["positions"]), req.fields.get("parents"), req.fields.get("keep"),
                        sent, returned, [returned is not None] * t, labels)
        self.steps.append(step)
        if returned is not None:
            live.extend((len(self.steps) - 1, j) for j in range(t))

    def _drop(self, entries: Sequence[tuple[int, int]]) -> None:
        for s, j in entries:
            self.steps[s].kept[j] = False

    def _apply_keep(self, live: list[tuple[int, int]], keep: dict) -> None:
        prefix, accepted = int(keep["prefix"]), [int(i) for i in keep["accepted"]]
        new = live[prefix:]
        chosen = [new[i] for i in accepted if 0 <= i < len(new)]
        keep_set = set(chosen)
        self._drop([e for e in new if e not in keep_set])
        live[prefix:] = chosen


@dataclass
class _Doc:
    doc_id: str
    text: str
    pii_spans: list[dict[str, Any]]
    sessions: list[str] = field(default_factory=list)


class WireTap:
    """Record a SplitModel's wire traffic with token labels; use as a context manager around generation.

    ``with WireTap(sm) as wt: wt.document("d1", prompt); sm.generate(prompt, 32)`` then ``wt.save()``.
    Each session opened while a document is current belongs to it (one
    generation = one session = one document).
    """

    def __init__(self, split_model: Any):
        self.sm = split_model
        self._last_ids: list[int] | None = None  # token ids of the latest head call not yet matched to a frame
        self.link = TapLink(split_model.link, self._label)
        self._docs: list[_Doc] = []
        self._hook = None
        self._saved_link: Link | None = None

    def __enter__(self) -> WireTap:
        self._saved_link = self.sm.link
        self.sm.link = self.sm.remote.link = self.link
        self._hook = self.sm.head.register_forward_hook(self._on_head)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.sm.link = self.sm.remote.link = self._saved_link
        if self._hook is not None:
            self._hook.remove()

    @property
    def steps(self) -> list[WireStep]:
        return self.link.steps

    def document(self, doc_id: str, text: str = "", pii_spans: Sequence[dict[str, Any]] = ()) -> None:
        """Start a document: the next session(s) belong to ``doc_id``; ``pii_spans`` index into ``text``."""
        self._docs.append(_Doc(str(doc_id), text, list(pii_spans)))

    def _on_head(self, module: Any, args: tuple, output: torch.Tensor) -> None:
        self._last_ids = [int(i) for i in args[0][0].tolist()]  # input_ids (1, T)

    def _label(self, t: int) -> list[int] | None:
        """Labels of a forward frame: the head call right before it (a frame with none, e.g. a replay, gets -1)."""
        ids, self._last_ids = self._last_ids, None
        if ids is None or len(ids) != t:
            log.warning("wire tap: no head call of %d tokens matches a forward frame; its labels are -1", t)
            return None
        return ids

    # ------------------------------------------------------------ saving
    def _documents(self) -> dict[str, int]:
        """Session -> document index, creating one document per unclaimed session."""
        owner: dict[str, int] = {}
        doc_iter = iter(range(len(self._docs)))
        current = None
        for st in self.steps:
            if st.session in owner:
                continue
            current = next(doc_iter, None)
            if current is None:
                self._docs.append(_Doc(f"session-{len(self._docs)}", "", []))
                current = len(self._docs) - 1
            owner[st.session] = current
        return owner

    def save(self, directory: str | Path | None = None, dtype: str = "fp16",
             shard_tokens: int = 32768) -> dict[str, TapSet]:
        """Write ``head-A`` and ``tail-B`` tap sets under ``directory``; return them as ``{"head", "tail"}``."""
        if not self.steps:
            raise AttackError("the wire tap recorded no forward frames; generate something inside `with WireTap(sm)`")
        if dtype not in STORE_DTYPES:
            raise AttackError(f"unknown tap dtype {dtype!r}; choose one of {', '.join(STORE_DTYPES)}")
        loaded, split = self.sm.loaded, self.sm.split
        owner = self._documents()
        if directory is None:
            h = hashlib.sha256(loaded.sha256.encode())
            for st in self.steps:
                h.update(st.sent.contiguous().view(torch.uint8).numpy().tobytes())
            directory = taps_root() / "wire" / f"{split.head_layers}-{split.tail_layers}-{h.hexdigest()[:16]}"
        directory = Path(directory)
        out = {}
        for side, layers in (("head", split.head_layers), ("tail", split.tail_layers)):
            b = Boundary(side, layers)
            steps = [i for i, st in enumerate(self.steps) if side == "head" or st.returned is not None]
            out[side] = self._write(directory / f"{side}-{layers}", b, steps, owner, dtype, shard_tokens)
        return out

    def _write(self, directory: Path, b: Boundary, steps: list[int], owner: dict[str, int], dtype: str,
               shard_tokens: int) -> TapSet:
        loaded = self.sm.loaded
        found = {s["type"] for d in self._docs for s in d.pii_spans}
        types = list(SPAN_TYPES) + sorted(found - set(SPAN_TYPES))  # the same codes as extracted taps
        docs = [{"doc_id": d.doc_id, "group_id": d.doc_id, "genre": "wire", "split": "wire", "text": d.text,
                 "pii_spans": d.pii_spans, "chunks": []} for d in self._docs]
        per_doc = _token_offsets(self.steps, owner, self._docs, loaded.tokenizer, docs)
        chunks, arrays, start, shards = [], [], 0, []
        np_dtype = STORE_DTYPES[dtype][1]
        directory.mkdir(parents=True, exist_ok=True)

        def flush() -> None:
            merged = {k: np.concatenate([a[k] for a in arrays]) for k in arrays[0]}  # (N, ...) per array
            write_shard(directory / shard_name(len(shards)), merged)
            shards.append({"file": shard_name(len(shards)), "n_tokens": start})

        for i in steps:
            st = self.steps[i]
            t = len(st.positions)
            if arrays and start + t > shard_tokens:
                flush()
                arrays, start = [], 0
            d = owner[st.session]
            offs = per_doc[i]  # (T, 2)
            hidden = st.sent if b.side == "head" else st.returned
            docs[d]["chunks"].append(len(chunks))
            real = offs[:, 1] > offs[:, 0]
            chunks.append({"doc": d, "chunk": st.step, "shard": len(shards), "start": start, "length": t,
                           "char_start": int(offs[real, 0].min()) if real.any() else -1,
                           "char_end": int(offs[real, 1].max()) if real.any() else -1,
                           "session": st.session, "keep": st.keep})
            start += t
            arrays.append({
                "hidden": hidden.float().numpy().astype(np_dtype),
                "token_ids": np.asarray(st.token_ids if st.token_ids is not None else [-1] * t, dtype=np.int32),
                "positions": np.asarray(st.positions, dtype=np.int32),
                "offsets": offs,
                "pii_labels": pii_label_array(offs, self._docs[d].pii_spans, types),
                "parents": np.asarray(st.parents if st.parents is not None else [-2] * t, dtype=np.int32),
                "kept": np.asarray(st.kept, dtype=np.int8),
            })
        flush()
        split = self.sm.split
        write_index(directory, {
            "format_version": FORMAT_VERSION, "kind": "wire", "complete": True, "key": None,
            "model": loaded.spec, "model_sha256": loaded.sha256, "num_layers": loaded.num_layers,
            "hidden_size": loaded.hidden_size, "split": "wire", "runtime_split": str(split), "boundary": str(b),
            "depth": b.depth(loaded.num_layers), "wire_dtype": str(self.sm.wire_dtype).removeprefix("torch."),
            "dtype": np.dtype(np_dtype).name, "n_tokens": sum(c["length"] for c in chunks), "pii_types": types,
            "commits": self.link.commits, "documents": docs, "chunks": chunks, "shards": shards,
        })
        return TapSet(directory)


def _token_offsets(steps: list[WireStep], owner: dict[str, int], docs: list[_Doc], tokenizer: Any,
                   doc_entries: list[dict[str, Any]]) -> dict[int, np.ndarray]:
    """Per step, (T, 2) char offsets of its tokens in its document's text; (-1, -1) for rejected drafts.

    A document's text becomes the decoded committed token stream (prompt +
    generated tokens sent to the cloud). PII spans of the prompt are kept when
    that text starts with the prompt, and dropped with a warning otherwise.
    """
    out: dict[int, np.ndarray] = {}
    for d, doc in enumerate(docs):
        mine = [i for i, st in enumerate(steps) if owner[st.session] == d]
        ids, where = [], []  # committed token ids in cache order, and (step, j) of each
        for i in mine:
            st = steps[i]
            out[i] = np.full((len(st.positions), 2), -1, dtype=np.int32)
            for j, kept in enumerate(st.kept):
                if kept and st.token_ids is not None:
                    ids.append(st.token_ids[j])
                    where.append((i, j))
        order = sorted(range(len(ids)), key=lambda k: steps[where[k][0]].positions[where[k][1]])
        ids, where = [ids[k] for k in order], [where[k] for k in order]
        end = 0
        for k, (i, j) in enumerate(where):
            text = tokenizer.decode(ids[: k + 1], skip_special_tokens=False).rstrip("\ufffd")
            out[i][j] = (end, max(end, len(text)))
            end = max(end, len(text))
        full = tokenizer.decode(ids, skip_special_tokens=False) if ids else doc.text
        if doc.pii_spans and not full.startswith(doc.text):
            log.warning("document %s: the decoded tokens do not reproduce the prompt text; PII spans dropped",
                        doc.doc_id)
            doc.pii_spans = []
            doc_entries[d]["pii_spans"] = []
        doc_entries[d]["text"] = full
    return out


def record_generations(split_model: Any, prompts: Sequence[str] | Any, max_new_tokens: int = 32, *,
                       generate: Callable[..., Any] | None = None, **generate_kwargs: Any) -> WireTap:
    """Generate for each prompt (a list of strings or a corpus Dataset) under a :class:`WireTap`; return it.

    With a Dataset, its ``doc_id``, ``text`` and ``pii_spans`` columns name
    the documents and label PII in the prompts. ``generate(split_model,
    prompt, max_new_tokens, **generate_kwargs)`` replaces
    ``split_model.generate`` (e.g. to decode speculatively).
    """
    run = generate or (lambda sm, text, n, **kw: sm.generate(text, n, **kw))
    if hasattr(prompts, "column_names"):
        items = [(r["doc_id"], r["text"], r["pii_spans"]) for r in prompts]
    else:
        items = [(f"prompt-{i}", p, []) for i, p in enumerate(prompts)]
    if not items:
        raise AttackError("no prompts to generate from; pass at least one")
    with WireTap(split_model) as wt:
        for doc_id, text, spans in items:
            wt.document(doc_id, text, spans)
            run(split_model, text, max_new_tokens, **generate_kwargs)
    return wt
