"""Activation taps: boundaries, truncated forward, equality with LocalHead, cache/resume, memory mapping, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from attacks import taps as taps_mod
from attacks.boundary import Boundary
from attacks.errors import AttackError
from attacks.taps import TruncatedForward, extract_corpora, extract_depths, extract_taps, plan_batches
from attacks.tapstore import TapSet
from attacks.wiretap import WireTap
from splitinfer.client import SplitModel
from splitinfer.corpora import CorpusError

TEXTS = [
    "Hello world, this is a test.",  # 28 bytes
    "Hello world, this is a tesx.",  # same length: shares a batch with the first
    "Another document, a little longer than the first one.",
    "Call John Smith at 555-1234 about the invoice.",
    "short",
]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))


def write_jsonl(path: Path, docs: list[dict]) -> str:
    path.write_text("\n".join(json.dumps(d) for d in docs), encoding="utf-8")
    return f"file:{path}"


@pytest.fixture
def corpus(tmp_path: Path) -> str:
    docs = [{"doc_id": f"d{i}", "text": t} for i, t in enumerate(TEXTS)]
    docs[3]["pii_spans"] = [{"start": 5, "end": 15, "type": "person"}, {"start": 19, "end": 27, "type": "phone"}]
    return write_jsonl(tmp_path / "docs.jsonl", docs)


def sent_by_local_head(tiny, split: str, text: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(sent, returned) hidden states of the prefill frame of a real split generation of ``text`` (fp32 wire)."""
    sm = SplitModel(tiny, split, wire_dtype="fp32")
    with WireTap(sm) as wt:
        sm.generate(text, 1, stop_on_eos=False)
    step = wt.steps[0]
    return step.sent, step.returned  # (T, d) each


def test_plan_batches_exact_groups_equal_lengths_only() -> None:
    lengths = [5, 3, 5, 5, 3, 7]
    batches = plan_batches(lengths, batch_size=2)
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert all(len({lengths[i] for i in b}) == 1 and len(b) <= 2 for b in batches)
    padded = plan_batches(lengths, batch_size=4, padded=True)
    assert [len(b) for b in padded] == [4, 2] and lengths[padded[0][0]] == 7


# ---------------------------------------------------------------------------- equality with the runtime


def assert_same_as_wire(ts: TapSet, loaded, split: str, side: int, exact: bool) -> None:
    for doc in ts.documents():
        wire = sent_by_local_head(loaded, split, doc.text)[side].numpy()
        if exact:
            assert np.array_equal(doc.hidden, wire), doc.doc_id
        else:  # other batch shapes may take other BLAS/sdpa code paths: equal up to float rounding
            np.testing.assert_allclose(doc.hidden, wire, rtol=1e-5, atol=1e-5 * float(np.abs(wire).max()))
        assert doc.token_ids.tolist() == loaded.tokenizer(doc.text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("boundary, split", [("head:2", "2,2"), ("head:1", "1,3"), ("tail:2", "2,2")])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_extracted_states_equal_what_the_runtime_sends(tiny, corpus: str, boundary: str, split: str,
                                                       batch_size: int) -> None:
    """Acceptance: the extracted states equal the frame the cloud gets (fp32); bit-identical at batch size 1."""
    ts = extract_taps(tiny, corpus, boundary, dtype="fp32", batch_size=batch_size, max_length=64, progress=False)
    assert len(ts) == len(TEXTS) and ts.boundary == boundary
    assert_same_as_wire(ts, tiny, split, 0 if boundary.startswith("head") else 1, exact=batch_size == 1)


def test_truncated_forward_batch_matches_single(tiny) -> None:
    stack = TruncatedForward.for_boundary(tiny, "head:3")
    ids = torch.randint(0, 256, (3, 20))
    batched = stack(ids)  # (3, 20, d)
    assert batched.shape == (3, 20, tiny.hidden_size)
    for i in range(3):
        assert torch.equal(batched[i], stack(ids[i : i + 1])[0])
    # right padding leaves the real tokens' states unchanged up to float reassociation
    padded = torch.cat([ids[:1, :12], torch.zeros(1, 8, dtype=torch.long)], dim=1)
    torch.testing.assert_close(stack(padded)[0, :12], stack(ids[:1, :12])[0], atol=1e-4, rtol=1e-4)


def test_padded_extraction_is_close_to_exact(tiny, corpus: str) -> None:
    exact = extract_taps(tiny, corpus, "head:2", dtype="fp32", progress=False)
    padded = extract_taps(tiny, corpus, "head:2", dtype="fp32", padded=True, progress=False)
    assert padded.path != exact.path  # different cache keys
    np.testing.assert_allclose(padded.hidden(), exact.hidden(), atol=1e-4, rtol=1e-4)
    assert np.array_equal(padded.token_ids(), exact.token_ids())


# ---------------------------------------------------------------------------- contents


def test_chunking_max_tokens_offsets_and_pii_labels(tiny, tmp_path: Path) -> None:
    text = "Alice Example lives at 12 Main Street. " * 4
    spans = [{"start": 0, "end": 13, "type": "person"}, {"start": 14, "end": 19, "type": "custom"},
             {"start": 62, "end": 76, "type": "address"}]
    c = write_jsonl(tmp_path / "long.jsonl", [{"doc_id": "long", "text": text, "pii_spans": spans},
                                              {"doc_id": "other", "text": "never reached"}])
    ts = extract_taps(tiny, c, "head:2", max_length=16, max_tokens=50, shard_tokens=20, progress=False)
    assert ts.n_tokens == 50 and ts.doc_ids == ["long"]
    assert [ch["length"] for ch in ts.chunks] == [16, 16, 16, 2]
    assert [s.positions.tolist() for s in ts][0] == list(range(16))
    assert ts.positions().tolist() == [p for n in (16, 16, 16, 2) for p in range(n)]
    assert ts.hidden().dtype == np.float16 and ts.hidden().shape == (50, tiny.hidden_size)
    (doc,) = list(ts.documents())
    assert doc.chunk_lengths == [16, 16, 16, 2] and text.startswith(doc.text) and len(doc.text) == 50
    for tid, (s, e) in zip(doc.token_ids, doc.offsets):  # byte-level tokenizer: one ASCII char per token
        assert tiny.tokenizer.decode([int(tid)]) == text[s:e]
    assert ts.pii_types[:4] == ["person", "email", "phone", "address"] and ts.pii_types[-1] == "custom"
    labels = doc.pii_labels
    assert (labels[:13] == 1).all() and (labels[14:19] == len(ts.pii_types)).all()
    assert labels[13] == 0 and (labels[19:] == 0).all()  # the address span starts after token 50
    assert doc.pii_spans == spans[:2]  # spans beyond the covered text are dropped


def test_extract_corpora_splits_the_token_budget(tiny, corpus: str, tmp_path: Path) -> None:
    other = write_jsonl(tmp_path / "b.jsonl", [{"text": "x" * 100}])
    a, b = extract_corpora(tiny, [corpus, other], "head:2", max_tokens=41, progress=False)
    assert (a.n_tokens, b.n_tokens) == (21, 20)


# ---------------------------------------------------------------------------- cache, resume, memory mapping


class Interrupt(Exception):
    pass


def test_cache_hit_and_resume_without_recomputing(tiny, corpus: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kw = dict(max_length=16, shard_tokens=24, dtype="fp32", progress=False)

    def stop(i: int) -> None:
        raise Interrupt

    with pytest.raises(Interrupt):
        extract_taps(tiny, corpus, "head:2", on_shard=stop, **kw)  # dies right after shard 0
    path = next((Path(taps_mod.taps_root())).glob("*/*head2*"))
    assert (path / "shard-00000.safetensors").is_file() and not (path / "shard-00001.safetensors").exists()
    with pytest.raises(AttackError, match="incomplete"):
        TapSet(path)
    written: list[int] = []
    ts = extract_taps(tiny, corpus, "head:2", on_shard=written.append, **kw)
    n_shards = len(ts.index["shards"])
    assert n_shards >= 3 and written == list(range(1, n_shards))  # shard 0 was not recomputed
    fresh = extract_taps(tiny, corpus, "head:2", root=path.parent / "fresh", **kw)
    assert np.array_equal(ts.hidden(), fresh.hidden()) and np.array_equal(ts.offsets(), fresh.offsets())

    def no_compute(*a, **k):
        raise AssertionError("a cache hit must not run the model")

    monkeypatch.setattr(TruncatedForward, "forward", no_compute)
    again = extract_taps(tiny, corpus, "head:2", on_shard=no_compute, **kw)
    assert again.path == ts.path and np.array_equal(again.hidden(), ts.hidden())
    with pytest.raises(AssertionError, match="must not run"):  # another max_length is another cache entry
        extract_taps(tiny, corpus, "head:2", **{**kw, "max_length": 8})


def test_memory_mapped_views_and_document_split(tiny, corpus: str) -> None:
    ts = extract_taps(tiny, corpus, "head:2", shard_tokens=10_000, progress=False)
    assert isinstance(ts.shard(0)["hidden"], np.memmap)
    h = ts.hidden()
    assert isinstance(h, np.memmap) and not h.flags.writeable  # one shard, contiguous: zero-copy view
    assert h.shape == (ts.n_tokens, tiny.hidden_size) and len(ts.token_ids()) == ts.n_tokens
    seq = ts.sequence(2)
    assert isinstance(seq.hidden, np.memmap) and seq.doc_id == "d2"
    sub = ts.select([3, 1])
    assert sub.doc_ids == ["d3", "d1"] and sub.n_tokens == len(sub.hidden())
    assert np.array_equal(sub.hidden()[: sub.chunks[0]["length"]], ts.sequence(3).hidden)
    train, test = ts.split(test_fraction=0.4, seed=1)
    assert set(train.doc_ids).isdisjoint(test.doc_ids) and set(train.doc_ids) | set(test.doc_ids) == set(ts.doc_ids)
    assert len(train.hidden()) + len(test.hidden()) == ts.n_tokens
    assert ts.doc_index().tolist() == np.repeat(np.arange(5), [c["length"] for c in ts.chunks]).tolist()
    empty = ts.select([])
    assert len(empty) == 0 and empty.hidden().shape == (0, tiny.hidden_size) and empty.n_tokens == 0
    with pytest.raises(AttackError, match="no per-token array 'parents'"):
        ts.array("parents")
    reopened = TapSet(ts.path)
    assert np.array_equal(reopened.hidden(), h) and reopened.index["model_sha256"] == tiny.sha256


# ---------------------------------------------------------------------------- errors


def test_clear_errors(tiny, tmp_path: Path, corpus: str) -> None:
    with pytest.raises(CorpusError, match="unknown corpus 'nope'"):
        extract_taps(tiny, "nope", "head:2", progress=False)
    with pytest.raises(CorpusError, match="does not exist"):
        extract_taps(tiny, f"file:{tmp_path / 'missing.txt'}", "head:2", progress=False)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(CorpusError, match="not UTF-8"):
        extract_taps(tiny, f"file:{bad}", "head:2", progress=False)
    with pytest.raises(AttackError, match="outside the model: it has 6 layers"):
        extract_taps(tiny, corpus, "head:5", progress=False)
    with pytest.raises(AttackError, match="outside the model"):
        extract_taps(tiny, corpus, "tail:0", progress=False)
    empty = write_jsonl(tmp_path / "empty.jsonl", [{"text": ""}, {"text": ""}])
    with pytest.raises(AttackError, match="yields no tokens"):
        extract_taps(tiny, empty, "head:2", progress=False)
    blank = tmp_path / "blank.txt"
    blank.write_text("  \n", encoding="utf-8")
    with pytest.raises(CorpusError, match="contains no documents"):
        extract_taps(tiny, f"file:{blank}", "head:2", progress=False)
    for kwargs, pattern in (({"max_length": 0}, "max_length"), ({"max_length": 5000}, "context of 1024"),
                            ({"max_tokens": 0}, "max_tokens"), ({"dtype": "int8"}, "unknown tap dtype")):
        with pytest.raises(AttackError, match=pattern):
            extract_taps(tiny, corpus, "head:2", progress=False, **kwargs)
    with pytest.raises(AttackError, match="not a tap set"):
        TapSet(tmp_path)


# ---------------------------------------------------------------------------- CLI


def test_cli_extract_and_errors(tiny, corpus: str, capsys: pytest.CaptureFixture) -> None:
    from splitinfer.cli import main

    rc = main(["attack", "extract", "--model", "tiny-random", "--corpus", corpus, "--boundary", "head:2,tail:1",
               "--max-length", "32", "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    summary = json.loads(out.strip().splitlines()[-1])
    assert [t["boundary"] for t in summary["taps"]] == ["head:2", "tail:1"]
    assert summary["taps"][0]["split"] == "all" and summary["taps"][0]["tokens"] > 0
    assert TapSet(summary["taps"][1]["path"]).index["depth"] == 5
    rc = main(["attack", "extract", "--model", "tiny-random", "--corpus", corpus, "--boundary", "head:9"])
    err = capsys.readouterr().err
    assert rc == 2 and "head:9 is outside the model" in err and "Traceback" not in err


def test_cli_corpora_lists_patterns_without_loading_them(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from splitinfer import corpora
    from splitinfer.cli import main

    monkeypatch.setattr(corpora, "list_corpora", lambda: [
        {"name": "file:<path>", "genre": "file", "description": "a file", "default_split": "all"},
        {"name": "hf:<dataset>[:<config>]:<split>", "genre": "hf", "description": "hub", "default_split": "all"}])
    monkeypatch.setattr(corpora, "load_corpus", lambda *a, **k: pytest.fail("patterns must not be loaded"))
    assert main(["attack", "corpora"]) == 0
    out = capsys.readouterr().out
    assert "file:<path>" in out and "hf:<dataset>[:<config>]:<split>" in out


# ---------------------------------------------------------------------------- real model


@pytest.mark.real_model
@pytest.mark.parametrize("batch_size", [1, 4])
def test_real_model_head_states_equal_local_head(real_model, tmp_path: Path, batch_size: int) -> None:
    texts = ["The State of the Union is strong.", "def add(a, b):\n    return a + b\n",
             "Patient Jane Roe, DOB 1970-01-01, was seen today.", "The State of the Union is great."]
    c = write_jsonl(tmp_path / "real.jsonl", [{"text": t} for t in texts])
    ts = extract_taps(real_model, c, "head:2", dtype="fp32", batch_size=batch_size, progress=False)
    assert len(ts) == 4
    assert_same_as_wire(ts, real_model, "2,2", 0, exact=batch_size == 1)


def test_extract_depths_keys_taps_as_the_boundaries_were_given(tiny, corpus: str) -> None:
    """Code passes Boundary objects and gets them back as keys; a string is keyed by its canonical form."""
    head, tail = Boundary("head", 1), Boundary("tail", 2)
    got = extract_depths(tiny, corpus, [head, tail, " head:2"], max_length=16, progress=False)
    assert list(got) == [head, tail, "head:2"]
    assert got[head].meta["boundary"] == "head:1" and got[tail].meta["depth"] == tiny.num_layers - 2


def test_every_sequence_starts_with_the_tokenizers_bos_and_it_is_public(tiny, tmp_path: Path) -> None:
    """With a BOS-adding tokenizer (Llama, Mistral, Gemma) each sequence the taps compute starts with the BOS, a
    document's later sequences included, and the BOS is never scored as user text (before: no BOS anywhere)."""
    from splitinfer.corpora import template_token_mask
    from splitinfer.models import LoadedModel
    from tests.splitinfer.test_tokens import llama_style_tokenizer

    tok = llama_style_tokenizer()
    loaded = LoadedModel(tiny.model, tok, "tiny-bos", tiny.sha256, None)
    text = "Alice Example lives at 12 Main Street. " * 2
    c = write_jsonl(tmp_path / "bos.jsonl", [{"doc_id": "d", "text": text}])
    ts = extract_taps(loaded, c, "head:2", max_length=16, max_tokens=40, shard_tokens=64, progress=False)
    (doc,) = list(ts.documents())
    starts = np.cumsum([0] + doc.chunk_lengths[:-1])
    assert all(doc.token_ids[s] == tok.bos_token_id for s in starts) and max(doc.chunk_lengths) <= 16
    public = template_token_mask(doc.offsets, [])  # how scoring finds public positions (attacks/evaluate.py)
    assert public.tolist() == [bool(i in set(starts.tolist())) for i in range(len(doc.token_ids))]
    user = "".join(text[s:e] for (s, e), p in zip(doc.offsets, public) if not p)
    assert text.startswith(user) and len(user) == sum(doc.chunk_lengths) - len(starts)


def test_spread_tokens_draws_on_every_corpus_of_a_pool_where_head_tokens_takes_the_first() -> None:
    """A training pool is concatenated corpus by corpus: its first 20,000 tokens were prose alone, and the
    matchers' candidate proposer was fitted on them (code and PII never seen)."""
    from attacks.tapdata import Taps
    from tests.attacks.synth import make_taps

    pool = Taps.concat([make_taps(n_seqs=10, seq_len=12, first_doc=10 * c) for c in range(4)])  # 4 "corpora"
    corpus_of = lambda t: {int(d) // 10 for d in t.seq_doc}  # noqa: E731
    assert corpus_of(pool.head_tokens(120)) == {0}
    sample = pool.spread_tokens(120)
    assert corpus_of(sample) == {0, 1, 2, 3} and sample.n_tokens <= 120 and len(sample) == 10
    assert pool.spread_tokens(10_000) is pool and pool.spread_tokens(pool.n_tokens) is pool
    assert len(pool.spread_tokens(5)) == 1  # at least one whole sequence
    assert list(pool.spread_tokens(200).seq_doc) == sorted(pool.spread_tokens(200).seq_doc)  # in pool order


@pytest.mark.parametrize("sizes, seq_lens, budget", [
    ((10, 10, 10, 10), (12, 12, 12, 12), 400),  # a budget just under a whole stride
    ((9, 3), (100, 100), 350),  # corpora of unequal size
    ((20, 5, 7), (8, 30, 17), 333),  # unequal sequence lengths
])
def test_spread_tokens_gives_each_corpus_its_share_within_one_sequence(sizes, seq_lens, budget) -> None:
    from attacks.tapdata import Taps
    from tests.attacks.synth import make_taps

    parts = [make_taps(n_seqs=n, seq_len=m, first_doc=100 * c) for c, (n, m) in enumerate(zip(sizes, seq_lens))]
    pool = Taps.concat(parts)
    sample = pool.spread_tokens(budget)
    assert sample.n_tokens <= budget
    corpus = [int(sample.documents[d]["doc_id"][3:]) // 100 for d in sample.seq_doc]  # doc ids doc{100c + i}
    got = np.bincount(corpus, weights=sample.seq_lengths, minlength=len(sizes))
    for c, part in enumerate(parts):
        share = part.n_tokens * budget / pool.n_tokens
        assert abs(got[c] - share) <= seq_lens[c], (c, got[c], share)
