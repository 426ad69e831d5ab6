"""The one scored set of a (model, head depth) cell: every attacker is scored on exactly these tokens (issue 28).

Issue 28 finding 1: the costly attacker was scored on the first 4-16 tokens of
4 prose documents, two of which opened with the same 16 tokens ("Fellow-Citizens
of the Senate and House of Representatives: In", as do 37 of the 199 training
speeches), and no chat user text was scored at all; finding 3: the "best
attacker" was picked on those tokens but reported on its own, wider set.

:func:`common_set` takes from the held-out test taps of every corpus, per
document, one sequence (a prefix from position 0, as a split client's prompt
starts) cut just after ``user_tokens`` user-text tokens. Public positions
(chat template, tokenizer-added special tokens: :func:`attacks.public.public_mask`)
ride along unscored, so chat documents contribute their user turns. De-duplication:
a sequence whose first ``dedup_tokens`` user tokens open another chosen
sequence, or any training sequence, is skipped for the document's next
sequence (formulaic openings would otherwise be scored as recovered text
memorised in training); training openings come from tokenising the train
splits (:func:`train_openings`), so two stages with different training sizes
choose the same set. :func:`check_size` refuses a set below the suite's
floor (quick: 300 tokens from 20 documents; full: 2,000 from 60).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attacks.public import public_mask
from attacks.tapdata import Taps
from splitinfer.errors import SplitInferError

__all__ = ["ScoredSetConfig", "choose", "take", "common_set", "check_size", "set_size", "openings", "train_openings"]


@dataclass(frozen=True)
class ScoredSetConfig:
    """Sizes of the common set (per corpus and in all) and the floor it must reach."""

    user_tokens: int = 16  # user-text tokens scored per document (a document holding fewer gives what it has)
    docs_per_corpus: int = 6
    dedup_tokens: int = 8  # a sequence opening with the same user tokens as a chosen or training one is skipped
    min_tokens: int = 300
    min_documents: int = 20

    @classmethod
    def from_suite(cls, cfg: dict) -> ScoredSetConfig:
        """The ``scored_set = {...}`` table of a suite stage (missing keys: these defaults; no table: these sizes
        and no floor, for suites that promise none)."""
        if "scored_set" not in cfg:
            return cls(min_tokens=0, min_documents=0)
        raw = dict(cfg["scored_set"])
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise SplitInferError(f"scored_set has unknown key(s) {sorted(unknown)}; use "
                                  f"{sorted(cls.__dataclass_fields__)}")
        for key, value in raw.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SplitInferError(f"scored_set.{key} must be a whole number >= 0, got {value!r}")
        return cls(**raw)


def _user_ids(taps: Taps, public: np.ndarray, rows: slice) -> np.ndarray:
    return taps.token_ids[rows][~public[rows]]


def openings(taps: Taps, n: int) -> set[tuple[int, ...]]:
    """The first ``n`` user-text token ids of every sequence of ``taps`` (those with at least ``n``)."""
    public = public_mask(taps)
    out = set()
    for _, rows in taps.sequences():
        ids = _user_ids(taps, public, rows)
        if len(ids) >= n:
            out.add(tuple(ids[:n].tolist()))
    return out


def choose(test: Taps, rows: dict[str, tuple[int, int]], cfg: ScoredSetConfig,
           seen: set[tuple[int, ...]] | None = None) -> list[tuple[int, int]]:
    """(sequence index, tokens kept) of the scored set: per corpus (``rows``: corpus -> its token rows of
    ``test``) up to ``docs_per_corpus`` documents, one de-duplicated sequence each, cut after ``user_tokens``
    user-text tokens.

    ``seen``: openings to avoid (:func:`openings` of the training taps). Sequences holding no user text are
    skipped. Sequences are in corpus order.
    """
    public = public_mask(test)
    starts = test.seq_starts()
    seen = set(seen or ())
    chosen: list[int] = []
    cut: list[int] = []
    for lo, hi in rows.values():
        docs_taken: set[int] = set()
        for s in range(int(np.searchsorted(starts, lo)), len(test)):
            if starts[s] >= hi or len(docs_taken) >= cfg.docs_per_corpus:
                break
            doc = int(test.seq_doc[s])
            if doc in docs_taken:
                continue
            sl = slice(int(starts[s]), int(starts[s + 1]))
            user = np.flatnonzero(~public[sl])  # positions of user text in the sequence
            if user.size == 0:
                continue
            key = tuple(test.token_ids[sl][user[: cfg.dedup_tokens]].tolist())
            if len(key) == cfg.dedup_tokens and key in seen:
                continue
            seen.add(key)
            docs_taken.add(doc)
            chosen.append(s)
            cut.append(int(user[min(cfg.user_tokens, user.size) - 1]) + 1)  # through the last scored user token
    if not chosen:
        raise SplitInferError("the scored set is empty: no test sequence holds user text; give more test_tokens")
    return list(zip(chosen, cut))


def take(taps: Taps, chosen: list[tuple[int, int]]) -> Taps:
    """The sequences of ``chosen`` (:func:`choose`), each cut to its length: the same selection applies to any
    taps of the same token sequences (a private victim's own states of the test split)."""
    lengths = taps.seq_lengths
    starts = taps.seq_starts()
    rows = np.concatenate([np.arange(starts[s], starts[s] + min(c, lengths[s])) for s, c in chosen])
    return Taps(np.asarray(taps.hidden[rows]), taps.token_ids[rows],
                np.asarray([min(c, lengths[s]) for s, c in chosen]), taps.seq_doc[[s for s, _ in chosen]],
                taps.documents, None if taps.offsets is None else taps.offsets[rows], dict(taps.meta))


def train_openings(tokenizer: Any, corpora: Sequence[str], seed: int, max_length: int, max_doc_tokens: int | None,
                   n: int, budget: int = 100_000) -> set[tuple[int, ...]]:
    """The first ``n`` user-text token ids of every training sequence of ``corpora`` (the first ``budget``
    tokens of each train split, cut into sequences as the taps cut them): tokenisation only, so the scored set
    does not depend on how many training tokens a stage fits its attackers on."""
    from attacks.tapplan import plan_sequences
    from splitinfer.corpora import load_corpus, template_token_mask

    out: set[tuple[int, ...]] = set()
    for corpus in corpora:
        plan = plan_sequences(load_corpus(corpus, "train", seed, None, tokenizer), tokenizer, max_length, budget,
                              1 << 40, max_doc_tokens)
        for c, ids, off in zip(plan.chunks, plan.ids, plan.offsets):
            spans = plan.documents[c["doc"]]["template_spans"]
            user = ids[~template_token_mask(off, spans)]
            if len(user) >= n:
                out.add(tuple(int(t) for t in user[:n]))
    return out


def common_set(test: Taps, rows: dict[str, tuple[int, int]], cfg: ScoredSetConfig,
               seen: set[tuple[int, ...]] | None = None) -> Taps:
    """The scored set of ``test`` (:func:`choose`, then :func:`take`)."""
    return take(test, choose(test, rows, cfg, seen))


def set_size(taps: Taps) -> tuple[int, int]:
    """(user-text tokens, documents holding at least one) of ``taps``."""
    public = public_mask(taps)
    docs = {int(d) for d, p in zip(taps.doc_index(), public) if not p}
    return int((~public).sum()), len(docs)


def check_size(taps: Taps, cfg: ScoredSetConfig, where: str) -> tuple[int, int]:
    """Refuse a scored set below ``cfg``'s floor; returns its (tokens, documents)."""
    tokens, docs = set_size(taps)
    if tokens < cfg.min_tokens or docs < cfg.min_documents:
        raise SplitInferError(f"{where}: the scored set holds {tokens} user-text tokens from {docs} documents, below the "
                         f"floor of {cfg.min_tokens} from {cfg.min_documents}; raise scored_set.docs_per_corpus or "
                         "user_tokens, or test_tokens so that the test split holds more documents")
    return tokens, docs
