"""Per-token predictions beside every scored result; `attack rescore` recomputes every metric (issue 14 item 11)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from attacks.base import Inversion
from attacks.errors import AttackError
from attacks.evaluate import collect, prior_from_taps
from attacks.predictions import read_predictions, rescore, rescore_dir, write_predictions
from attacks.tapdata import Taps
from splitinfer.cli import main
from tests.attacks.synth import make_taps
from tests.attacks.test_train import corpus  # noqa: F401  (fixture: a file: corpus with PII spans)


def _chat_taps(n_docs: int = 12, seed: int = 0) -> Taps:
    """Documents "<s>user: w1 w2 w3 w4</s>" as 1-char tokens: the first 7 and last 4 characters are template."""
    rng = np.random.default_rng(seed)
    docs, ids, offs = [], [], []
    for i in range(n_docs):
        body = rng.integers(20, 30, size=8)
        text = "<s>user" + "".join(chr(97 + int(t) - 20) for t in body) + "</s>"
        docs.append({"doc_id": f"c{i}", "genre": "chat", "text": text,
                     "pii_spans": [{"start": 7, "end": 9, "type": "name"}],
                     "template_spans": [{"start": 0, "end": 7}, {"start": 15, "end": 19}]})
        ids.append(np.concatenate([np.arange(1, 8), body, np.arange(8, 12)]))
        offs.append(np.stack([np.arange(19), np.arange(1, 20)], axis=1))
    token_ids = np.concatenate(ids)
    hidden = np.random.default_rng(1).normal(size=(len(token_ids), 4)).astype(np.float32)
    return Taps(hidden, token_ids, np.full(n_docs, 19), np.arange(n_docs), docs, np.concatenate(offs).astype(np.int32),
                {"boundary": "head:2"})


def _guess(taps: Taps, right: float, seed: int = 0) -> Inversion:
    rng = np.random.default_rng(seed)
    top = np.stack([taps.token_ids, taps.token_ids + 1, taps.token_ids + 2], axis=1)  # (N, 3)
    wrong = rng.random(taps.n_tokens) > right
    top[wrong, 0] = 0
    return Inversion(top[:, 0], top, np.zeros(top.shape, dtype=np.float32))


def test_collect_scores_user_text_and_template_apart() -> None:
    train, test = _chat_taps(seed=1), _chat_taps(seed=2)
    pred = collect(_guess(test, 0.5), test, vocab_size=100, prior=prior_from_taps(train), ks=(1, 3))
    assert all(t.sum() == 11 for t in pred.template)  # 7 + 4 template tokens per document
    m = pred.summarize()
    assert m["token_acc_top1"]["n"] == 12 * 8 and m["template_token_acc_top1"]["n"] == 12 * 11
    assert m["template_baseline_position_top1"]["value"] == 1.0  # the template is guessable from positions
    assert m["baseline_position_top1"]["value"] < 0.5
    assert "pii_recovery_name" in m and "baseline_position_pii_recovery_name" in m and "coverage" in m


def test_rescore_equals_the_original_metrics(tmp_path: Path) -> None:
    train, test = _chat_taps(seed=1), _chat_taps(seed=2)
    pred = collect(_guess(test, 0.6), test, vocab_size=100, prior=prior_from_taps(train), ks=(1, 3), n_boot=200,
                   meta={"attack": "fake"})
    path = write_predictions(tmp_path / "p.jsonl.gz", pred)
    again, back = rescore(path)
    assert again == pred.summarize() and back.meta == {"attack": "fake"} and back.complete
    with gzip.open(path, "rt") as f:
        header, first = json.loads(f.readline()), json.loads(f.readline())
    assert header["format"] == "splitinfer-predictions" and header["n_documents"] == 12
    assert set(first) == {"doc_id", "genre", "true", "topk", "positions", "template", "offsets", "pii_spans"}
    plain = make_taps(n_seqs=6)  # no offsets: no template, no PII
    p2 = collect(_guess(plain, 0.9), plain, train_token_ids=plain.token_ids)
    assert rescore(write_predictions(tmp_path / "q.jsonl.gz", p2))[0] == p2.summarize()


def test_size_cap_under_reports(tmp_path: Path) -> None:
    big = make_taps(n_seqs=400, seq_len=40, vocab=5000)
    pred = collect(_guess(big, 0.5), big)
    free = write_predictions(tmp_path / "out" / "p.jsonl.gz", pred)
    capped = write_predictions(tmp_path / "reports" / "p.jsonl.gz", pred, max_bytes=20_000)
    assert read_predictions(free).complete
    back = read_predictions(capped)
    assert not back.complete and 0 < len(back.doc_ids) < 400 and back.n_documents_total == 400
    assert capped.stat().st_size <= 22_000
    bad = tmp_path / "reports" / "x.gz"
    bad.write_text("not gzip")
    with pytest.raises(AttackError, match="not a gzipped predictions file"):
        read_predictions(bad)


def test_eval_writes_predictions_and_rescore_cli_matches(tmp_path: Path, corpus: str, capsys) -> None:  # noqa: F811
    out = tmp_path / "lp"
    assert main(["attack", "train", "--attack", "linear-probe", "--model", "tiny-random", "--boundary", "head:2",
                 "--corpus", corpus, "--max-tokens", "1500", "--epochs", "2", "--batch-size", "32",
                 "--out", str(out), "--json"]) == 0
    assert main(["attack", "eval", "--attacker", str(out), "--corpus", corpus, "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    path = Path(report["predictions"])
    assert path.is_file() and path.parent == out
    assert "baseline_position_top1" in report["metrics"] and "coverage" in report["metrics"]
    assert main(["attack", "rescore", str(path), "--json"]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["metrics"] == report["metrics"]
    assert main(["attack", "rescore", str(tmp_path / "missing.jsonl.gz")]) == 2
    assert "does not exist" in capsys.readouterr().err


def _rewrite(path: Path, out: Path, edit) -> Path:
    """``path``'s header and document lines, ``edit``ed (a function of the list of parsed lines), gzipped to ``out``."""
    with gzip.open(path, "rt") as f:
        lines = [json.loads(x) for x in f if x.strip()]
    with gzip.open(out, "wt") as f:
        f.write("".join(json.dumps(x) + "\n" for x in edit(lines)))
    return out


def test_a_damaged_predictions_file_is_one_line_never_a_rescore(tmp_path: Path) -> None:
    taps = make_taps(n_seqs=6)
    path = write_predictions(tmp_path / "p.jsonl.gz", collect(_guess(taps, 0.7), taps))

    def drop_key(key):
        return lambda lines: [lines[0], {k: v for k, v in lines[1].items() if k != key}, *lines[2:]]

    cases = {
        "no doc_id": (drop_key("doc_id"), "a document line is malformed"),
        "short topk": (lambda ls: [ls[0], {**ls[1], "topk": ls[1]["topk"][:-1]}, *ls[2:]], "is malformed"),
        "text tokens": (lambda ls: [ls[0], {**ls[1], "true": ["a"] * len(ls[1]["true"])}, *ls[2:]], "is malformed"),
        "no ks": (lambda ls: [{**ls[0], "settings": {}}, *ls[1:]], "no settings.ks"),
        # a document twice would count its tokens twice and narrow the interval
        "repeated document": (lambda ls: [*ls, ls[1]], "document 'doc0' occurs twice"),
    }
    for name, (edit, needle) in cases.items():
        with pytest.raises(AttackError, match=needle):
            read_predictions(_rewrite(path, tmp_path / f"{name}.jsonl.gz", edit))


def test_rescore_never_compares_with_another_document_beside_a_damaged_results_json(tmp_path: Path) -> None:
    (tmp_path / "predictions").mkdir()
    (tmp_path / "results.json").write_text("{ damaged")
    (tmp_path / "other.json").write_text(json.dumps({"results": {}}))
    with pytest.raises(AttackError, match="results.json' is not valid JSON"):
        rescore_dir(tmp_path)
