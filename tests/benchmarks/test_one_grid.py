"""One grid (issue 28): the attacks stage and the defenses stage choose the same scored set and score it the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attacks.boundary import Boundary
from benchmarks.suite import load_suite
from splitinfer.models import load_model

SET_KEYS = ("corpora", "test_tokens", "max_length", "max_doc_tokens", "scored_set")


@pytest.mark.parametrize("name", ["quick", "full"])
def test_the_suites_give_both_stages_the_same_scored_set(name: str) -> None:
    """Everything that decides the scored set is the same in [attacks] and [defenses] (training size is not:
    training openings come from tokenisation alone), and the quick/full floors of issue 28 hold."""
    suite = load_suite(name)
    att, dfn = suite.stage("attacks"), suite.stage("defenses")
    assert {k: att.get(k) for k in SET_KEYS} == {k: dfn.get(k) for k in SET_KEYS}
    floor = (300, 20) if name == "quick" else (2000, 60)
    assert (dfn["scored_set"]["min_tokens"], dfn["scored_set"]["min_documents"]) == floor
    assert dfn["utility_positions"] >= (2000 if name == "quick" else 10000)
    assert dfn["greedy_prompts"] >= (10 if name == "quick" else 40)


def test_attack_grid_and_defenses_stage_score_the_same_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.scored_set import ScoredSetConfig
    from benchmarks.stage_attacks import grid_config
    from benchmarks.attack_grid import extract
    from benchmarks.stage_defenses import grid_data

    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"doc_id": f"d{i}", "text": f"Dear all, note {i}: the fox jumps {i * 7} "
                                                                     "times over the lazy dog today."})
                              for i in range(120)), encoding="utf-8")
    table = {"corpora": [f"file:{path}"], "train_tokens": 800, "test_tokens": 600, "max_length": 32,
             "max_doc_tokens": 64, "scored_set": {"user_tokens": 8, "docs_per_corpus": 8, "dedup_tokens": 8,
                                                  "min_tokens": 40, "min_documents": 5}}
    tiny = load_model("tiny-random")
    attacks = extract(tiny, grid_config({**table, "head_depths": [2], "attacks": ["linear-probe"]}, 0))
    _, defenses = grid_data(tiny, table, [2], 0, ScoredSetConfig.from_suite(table))
    a, d = attacks.common[Boundary("head", 2)], defenses.common[Boundary("head", 2)]
    assert a.token_ids.tolist() == d.token_ids.tolist() and a.seq_lengths.tolist() == d.seq_lengths.tolist()
    assert [a.documents[i]["doc_id"] for i in a.seq_doc] == [d.documents[i]["doc_id"] for i in d.seq_doc]
    assert len(set(a.seq_doc.tolist())) == 8
    # "Dear all, note" opens every document (training ones too): the set takes the documents' second sequences
    opening = tiny.tokenizer("Dear all", add_special_tokens=False)["input_ids"]
    assert all(a.token_ids[s: s + len(opening)].tolist() != opening for s in a.seq_starts()[:-1])
