"""`attack compare`: A minus B on one scored set from two predictions files, as the grid's own columns pair them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attacks.compare import compare
from attacks.errors import AttackError
from attacks.evaluate import collect, doc_top1_counts, paired_gap, prior_from_taps
from attacks.predictions import write_predictions
from splitinfer.cli import main
from tests.attacks.test_predictions import _chat_taps, _guess


def _write(tmp_path: Path, name: str, taps, right: float, seed: int) -> Path:
    pred = collect(_guess(taps, right, seed), taps, vocab_size=100, prior=prior_from_taps(_chat_taps(seed=1)),
                   meta={"run": name})
    return write_predictions(tmp_path / f"{name}.jsonl.gz", pred)


def test_compare_prints_the_grids_own_paired_gap(tmp_path: Path) -> None:
    taps = _chat_taps(n_docs=24, seed=2)
    a, b = _write(tmp_path, "strong", taps, 0.9, 0), _write(tmp_path, "weak", taps, 0.3, 1)
    c = compare(a, b)
    pa = collect(_guess(taps, 0.9, 0), taps, vocab_size=100, prior=prior_from_taps(_chat_taps(seed=1)))
    pb = collect(_guess(taps, 0.3, 1), taps, vocab_size=100, prior=prior_from_taps(_chat_taps(seed=1)))
    sa, sb = pa.summarize()["token_acc_top1"], pb.summarize()["token_acc_top1"]
    assert c["a"]["token_acc_top1"] == pytest.approx(sa["value"])
    assert c["b"]["token_acc_top1"] == pytest.approx(sb["value"])
    gap = paired_gap({"doc_top1": doc_top1_counts(pa)}, {"doc_top1": doc_top1_counts(pb)})
    assert (c["diff"], c["ci_low"], c["ci_high"]) == pytest.approx((gap["value"], gap["ci_low"], gap["ci_high"]))
    assert c["significant"] and c["n_tokens"] == 24 * 8 and c["n_documents"] == 24  # user text only
    assert c["a"]["run"] == "strong" and c["complete"]


def test_compare_refuses_files_scored_on_different_tokens(tmp_path: Path) -> None:
    a = _write(tmp_path, "a", _chat_taps(seed=2), 0.9, 0)
    b = _write(tmp_path, "b", _chat_taps(seed=3), 0.9, 0)  # the same document ids, other tokens
    with pytest.raises(AttackError, match="scored on different tokens .document 'c0' holds other tokens"):
        compare(a, b)
    c = _write(tmp_path, "c", _chat_taps(n_docs=6, seed=2), 0.9, 0)
    with pytest.raises(AttackError, match="is in one file only"):
        compare(a, c)


def test_attack_compare_cli(tmp_path: Path, capsys) -> None:
    taps = _chat_taps(n_docs=24, seed=2)
    a, b = _write(tmp_path, "strong", taps, 0.9, 0), _write(tmp_path, "weak", taps, 0.3, 1)
    assert main(["attack", "compare", str(a), str(b), "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("A strong: ") and "paired over documents; the interval excludes 0" in out[2]
    assert json.loads(out[-1])["n_documents"] == 24
    assert main(["attack", "compare", str(a), str(tmp_path / "missing.jsonl.gz")]) == 2
    assert "does not exist" in capsys.readouterr().err
