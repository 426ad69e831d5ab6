"""The common scored set: de-duplicated openings, chat user turns (template public), sizes, one selection for any taps."""

from __future__ import annotations

import numpy as np
import pytest

from attacks.public import public_mask
from attacks.tapdata import Taps
from benchmarks.scored_set import ScoredSetConfig, check_size, choose, common_set, openings, set_size, take
from splitinfer.errors import SplitInferError


def _taps(seqs: list[tuple[int, list[int], list[bool]]], docs: list[dict]) -> Taps:
    """Hand-made taps: per sequence (document index, token ids, template flags); one char per token."""
    ids, offs, lens, seq_doc = [], [], [], []
    for doc, toks, template in seqs:
        ids += toks
        offs += [(i, i + 1) for i in range(len(toks))]
        lens.append(len(toks))
        seq_doc.append(doc)
        spans = [{"start": i, "end": i + 1} for i, t in enumerate(template) if t]
        docs[doc].setdefault("template_spans", spans)
    hidden = np.zeros((len(ids), 4), dtype=np.float32)
    return Taps(hidden, np.asarray(ids), np.asarray(lens), np.asarray(seq_doc), docs, np.asarray(offs, np.int32),
                {"boundary": "head:2", "depth": 2})


def _docs(n: int) -> list[dict]:
    return [{"doc_id": f"d{i}", "genre": "g", "text": "x" * 64, "pii_spans": []} for i in range(n)]


def test_formulaic_openings_are_skipped_for_the_documents_next_sequence() -> None:
    """Two documents open alike (and like a training document): the set scores their second sequences."""
    formula = [5, 6, 7, 8]
    test = _taps([(0, formula + [9, 10], [False] * 6), (0, [11, 12, 13, 14, 15, 16], [False] * 6),
                  (1, formula + [20, 21], [False] * 6), (1, [22, 23, 24, 25, 26, 27], [False] * 6),
                  (2, [30, 31, 32, 33, 34, 35], [False] * 6)], _docs(3))
    train = _taps([(0, formula + [40, 41], [False] * 6)], _docs(1))
    cfg = ScoredSetConfig(user_tokens=3, docs_per_corpus=5, dedup_tokens=4, min_tokens=1, min_documents=1)
    got = common_set(test, {"c": (0, test.n_tokens)}, cfg, openings(train, 4))
    assert got.token_ids.tolist() == [11, 12, 13, 22, 23, 24, 30, 31, 32]  # no opening scored twice
    assert [got.documents[d]["doc_id"] for d in got.seq_doc] == ["d0", "d1", "d2"]  # one sequence per document


def test_chat_user_turns_are_scored_and_template_positions_ride_along() -> None:
    """A chat sequence is cut after its user tokens; its template prefix is public and not counted."""
    tpl = [True, True, True, False, False, False, True, False]
    test = _taps([(0, [1, 2, 3, 50, 51, 52, 4, 53], tpl), (1, [1, 2, 3, 60, 61, 62, 4, 63], tpl)], _docs(2))
    cfg = ScoredSetConfig(user_tokens=4, docs_per_corpus=4, dedup_tokens=2, min_tokens=8, min_documents=2)
    got = common_set(test, {"chat": (0, test.n_tokens)}, cfg)
    assert got.seq_lengths.tolist() == [8, 8] and public_mask(got).sum() == 8
    assert set_size(got) == (8, 2) and check_size(got, cfg, "t") == (8, 2)
    with pytest.raises(SplitInferError, match="below the floor of 9 from 2; raise scored_set"):
        check_size(got, ScoredSetConfig(min_tokens=9, min_documents=2), "t")


def test_every_corpus_contributes_and_the_selection_applies_to_other_taps() -> None:
    a = _taps([(i, [100 + 10 * i + j for j in range(6)], [False] * 6) for i in range(6)], _docs(6))
    cfg = ScoredSetConfig(user_tokens=4, docs_per_corpus=2, dedup_tokens=2, min_tokens=1, min_documents=1)
    rows = {"x": (0, 18), "y": (18, 36)}
    chosen = choose(a, rows, cfg)
    assert [s for s, _ in chosen] == [0, 1, 3, 4]  # two documents from each corpus
    other = Taps(a.hidden + 1.0, a.token_ids, a.seq_lengths, a.seq_doc, a.documents, a.offsets, a.meta)
    b = take(other, chosen)
    assert b.token_ids.tolist() == common_set(a, rows, cfg).token_ids.tolist()
    assert float(b.hidden.min()) == 1.0  # the other taps' states


def test_unknown_suite_key_is_refused() -> None:
    with pytest.raises(SplitInferError, match="unknown key"):
        ScoredSetConfig.from_suite({"scored_set": {"tokens": 3}})
    assert ScoredSetConfig.from_suite({"scored_set": {"user_tokens": 3}}).user_tokens == 3
