"""De-duplication before splitting, and chat splits with no shared user turn (issue 14 item 1).

On the code before this change, chat had 2,026 documents but 899 distinct
normalised texts, and 119 of its 203 test documents were copies of training
documents: ``test_real_corpus_has_no_test_text_in_training[chat]`` and
``test_chat_test_user_turns_never_occur_in_training`` fail there.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest

from splitinfer.corpora import load_corpus, corpus_manifest, normalise_text, registry
from splitinfer.corpora.dedup import deduplicate, linked_groups, plan_splits

SMALL = {"prose": {}, "chat": {}, "code": {"n_files": 60}, "pii": {"n_docs": 300}}
SPLITS = ("train", "val", "test")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path_factory.getbasetemp() / "dedup-cache"))


def test_normalise_text_is_nfkc_casefolded_whitespace_collapsed() -> None:
    assert normalise_text("  Ｈｅｌｌｏ\t\tWORLD \n") == "hello world"  # full-width letters fold under NFKC
    assert normalise_text("Straße") == normalise_text("STRASSE")  # casefold, not lower
    assert normalise_text("a\u00a0b") == "a b"  # no-break space is whitespace
    assert normalise_text("a b") != normalise_text("ab")


def test_deduplicate_keeps_first_occurrence_in_order() -> None:
    assert deduplicate(["a", "b", "c", "d"], ["Hi  there", "other", "hi there", "OTHER\n"]) == ["a", "b"]


def test_linked_groups_merge_transitively_and_keep_existing_groups() -> None:
    groups = {"a": "g1", "b": "g2", "c": "g3", "d": "g4", "e": "g1"}
    links = {"a": ["x"], "b": ["y"], "c": ["x", "y"], "d": ["z"]}
    out = linked_groups(list(groups), groups, links)
    assert out["a"] == out["b"] == out["c"] == out["e"] == "g1" and out["d"] == "g4"


def test_plan_splits_never_puts_linked_documents_in_two_splits() -> None:
    ids = [f"d{i}" for i in range(200)]
    texts = [f"text {i}" for i in range(200)]
    links = {d: [f"q{i % 37}"] for i, d in enumerate(ids)}  # 37 questions, each asked in several documents
    splits, report = plan_splits(ids, texts, seed=0, links=links)
    owner = {}
    for split, members in splits.items():
        for d in members:
            assert owner.setdefault(links[d][0], split) == split
    assert report["n_groups"] == 37 and report["n_distinct"] == 200


def _with_copies(info: registry.CorpusInfo, n_copies: int) -> registry.CorpusInfo:
    """The same corpus plus copies of its first documents that differ only in trailing whitespace."""

    @functools.wraps(info.builder)  # keeps the option signature the loader checks
    def builder(*args, **kwargs):
        plan = info.builder(*args, **kwargs)
        originals = plan.doc_ids[:n_copies]
        base_make = plan.make

        def make(ids, splits):
            out = []
            for d, s in zip(ids, splits):
                doc = dict(base_make([d.removeprefix("copy:")], [s])[0])
                if d.startswith("copy:"):
                    doc.update(doc_id=d, group_id=d, text=doc["text"] + "\n \t ")
                out.append(doc)
            return out

        links = None if plan.links is None else {**plan.links, **{f"copy:{d}": plan.links[d] for d in originals}}
        return dataclasses.replace(plan, doc_ids=plan.doc_ids + [f"copy:{d}" for d in originals], make=make,
                                   links=links)

    return dataclasses.replace(info, builder=builder)


@pytest.mark.parametrize("name", ["prose", "chat", "code", "pii"])
def test_builtin_corpus_drops_copies_before_splitting(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry._REGISTRY, name, _with_copies(registry._REGISTRY[name], 20))
    parts = {s: load_corpus(name, s, cache=False, **SMALL[name]) for s in SPLITS}
    ids = [d for s in SPLITS for d in parts[s]["doc_id"]]
    assert not [d for d in ids if d.startswith("copy:")]  # every copy came after its original
    keys = [normalise_text(t) for s in SPLITS for t in parts[s]["text"]]
    assert len(keys) == len(set(keys))
    m = corpus_manifest(name, "test", cache=False, **SMALL[name])
    assert m["dedup"]["n_documents"] - m["dedup"]["n_distinct"] >= 20
    assert sum(m["split_sizes"].values()) == m["dedup"]["n_distinct"]


@pytest.mark.parametrize("name", ["prose", "chat", "code", "pii"])
def test_real_corpus_has_no_test_text_in_training(name: str) -> None:
    parts = {s: load_corpus(name, s, **SMALL[name]) for s in SPLITS}
    keys = {s: [normalise_text(t) for t in parts[s]["text"]] for s in SPLITS}
    for s in SPLITS:
        assert len(keys[s]) == len(set(keys[s])), f"{name}/{s} holds duplicate texts"
    assert not set(keys["test"]) & set(keys["train"]), f"{name}: test documents copied in training"
    assert not set(keys["val"]) & set(keys["train"])


def _user_turns(text: str) -> set[str]:
    return {normalise_text(line[len("User: "):]) for line in text.split("\n") if line.startswith("User: ")}


def test_chat_test_user_turns_never_occur_in_training() -> None:
    parts = {s: load_corpus("chat", s) for s in SPLITS}
    train_turns = set().union(*(_user_turns(t) for t in parts["train"]["text"]))
    shared = [t for t in parts["test"]["text"] if _user_turns(t) & train_turns]
    assert not shared, f"{len(shared)} of {len(parts['test'])} chat test documents repeat a training user turn"
    m = corpus_manifest("chat", "test")
    assert m["dedup"]["linked_by"] == "normalised user turn" and m["dedup"]["n_groups"] < m["dedup"]["n_distinct"]


def test_file_corpus_is_deduplicated(tmp_path: Path) -> None:
    path = tmp_path / "dup.jsonl"
    lines = ['{"text": "Same text."}', '{"text": "same   TEXT."}', '{"text": "other"}']
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ds = load_corpus(f"file:{path}")
    assert ds["text"] == ["Same text.", "other"]
