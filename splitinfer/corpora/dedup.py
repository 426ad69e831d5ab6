"""De-duplication and splitting of a corpus: no test text (or chat user turn) also in training.

Normalised text (:func:`normalise_text`): Unicode NFKC, then ``str.casefold``,
then every run of whitespace collapsed to one space and the ends stripped. Two
documents are duplicates when their normalised texts are equal.

Order of operations in :func:`plan_splits` (used by every corpus):

1. de-duplicate by normalised text, keeping the first document in corpus order;
2. merge groups that share a link key (chat: a normalised user turn, since
   chatterbot asks the same question with different answers), with a
   union-find, so that linked documents land in one split;
3. split whole groups with :func:`split_documents`.
"""

from __future__ import annotations

import random
import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from splitinfer.corpora.registry import CorpusError

SPLITS: tuple[str, ...] = ("train", "val", "test")
DEFAULT_FRACTIONS: tuple[float, float, float] = (0.8, 0.1, 0.1)
NORMALISATION = "unicode NFKC, casefold, whitespace runs collapsed to one space, ends stripped"
_WS = re.compile(r"\s+")


def normalise_text(text: str) -> str:
    """The text two documents are compared by: NFKC, case-folded, whitespace collapsed and stripped."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def split_documents(
    doc_ids: Sequence[str],
    seed: int,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    groups: Mapping[str, str] | None = None,
) -> dict[str, list[str]]:
    """Assign documents to ``train`` / ``val`` / ``test``, whole groups at a time.

    Group ids (``groups[doc_id]``, default the doc id itself) are sorted,
    shuffled with ``random.Random(seed)`` and cut at ``round(n * f_train)`` and
    ``round(n * (f_train + f_val))``. The result depends only on the set of ids,
    the groups, the seed and the fractions, never on input order. Each split
    lists its documents by shuffled group rank, then in input order.
    """
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
        raise CorpusError(f"bad split fractions {tuple(fractions)}: give three non-negative numbers (train, val, test) that sum to 1")
    seen: set[str] = set()
    for d in doc_ids:
        if d in seen:
            raise CorpusError(f"duplicate document id {d!r}: document ids must be unique within a corpus")
        seen.add(d)
    group_of = {d: (groups.get(d, d) if groups else d) for d in doc_ids}
    order = sorted(set(group_of.values()))
    random.Random(seed).shuffle(order)
    n = len(order)
    cut1, cut2 = round(n * fractions[0]), round(n * (fractions[0] + fractions[1]))
    rank = {g: i for i, g in enumerate(order)}
    assigned = {g: ("train" if i < cut1 else "val" if i < cut2 else "test") for g, i in rank.items()}
    position = {d: i for i, d in enumerate(doc_ids)}
    out: dict[str, list[str]] = {s: [] for s in SPLITS}
    for d in sorted(doc_ids, key=lambda d: (rank[group_of[d]], position[d])):
        out[assigned[group_of[d]]].append(d)
    return out


def deduplicate(doc_ids: Sequence[str], texts: Sequence[str]) -> list[str]:
    """The doc ids whose normalised text was not seen earlier in ``doc_ids`` (first occurrence kept)."""
    if len(doc_ids) != len(texts):
        raise CorpusError(f"{len(doc_ids)} document ids but {len(texts)} texts; the corpus builder is inconsistent")
    seen: set[str] = set()
    keep = []
    for d, t in zip(doc_ids, texts):
        key = normalise_text(t)
        if key not in seen:
            seen.add(key)
            keep.append(d)
    return keep


def linked_groups(doc_ids: Sequence[str], groups: Mapping[str, str] | None,
                  links: Mapping[str, Sequence[str]] | None) -> dict[str, str]:
    """doc id -> group id, where groups sharing any link key are merged (named by their smallest group id)."""
    group_of = {d: (groups.get(d, d) if groups else d) for d in doc_ids}
    parent = {g: g for g in group_of.values()}

    def find(g: str) -> str:
        while parent[g] != g:
            parent[g] = parent[parent[g]]
            g = parent[g]
        return g

    owner: dict[str, str] = {}
    for d in doc_ids:
        for key in (links or {}).get(d, ()):
            a, b = find(group_of[d]), find(owner.setdefault(key, group_of[d]))
            if a != b:
                parent[max(a, b)] = min(a, b)
    return {d: find(g) for d, g in group_of.items()}


def plan_splits(doc_ids: Sequence[str], texts: Sequence[str], seed: int, groups: Mapping[str, str] | None = None,
                links: Mapping[str, Sequence[str]] | None = None,
                fractions: Sequence[float] = DEFAULT_FRACTIONS) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """De-duplicate, merge linked groups, split (module docstring); returns the splits and a report for the manifest."""
    kept = deduplicate(doc_ids, texts)
    merged = linked_groups(kept, groups, links)
    splits = split_documents(kept, seed, fractions, merged)
    report = {"normalisation": NORMALISATION, "n_documents": len(doc_ids), "n_distinct": len(kept),
              "n_groups": len(set(merged.values())), "linked_by": "normalised user turn" if links else None}
    return splits, report
