"""bench compare: shared rows of two model families side by side, calibrated specs matched, the rest listed."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import schema
from benchmarks.cross_model import compare_documents, defense_rows, match_spec, write_comparison
from splitinfer.cli import main
from splitinfer.errors import SplitInferError

SHA_A, SHA_B = "d1e2331f1dc2" + "0" * 52, "7a3bc9e04f11" + "1" * 52


def _acc(doc: dict, run: str, name: str, value: float, lo: float | None, hi: float | None, n: int,
         higher: bool = True) -> None:
    schema.add_metric(doc, run, name, schema.metric(value, lo, hi, n, higher, kind="accuracy"))


def _defense(doc: dict, run: str, recovery: tuple, agreement: tuple) -> None:
    _acc(doc, run, "recovery_top1", *recovery, higher=False)
    _acc(doc, run, "next_token_agreement", *agreement)
    _acc(doc, f"{run}/linear-probe", "token_acc_top1", recovery[0], recovery[1], recovery[2], 999)  # a sub-row


def _smollm() -> dict:
    doc = schema.new_results({"model": "default", "model_sha256": SHA_A, "seed": 0}, "quick")
    doc["git_hash"], doc["git_dirty"] = "a" * 40, False
    _acc(doc, "attacks/vocab-match/head:2", "token_acc_top1", 0.875, 0.8125, 0.93125, 320)
    _acc(doc, "attacks/vocab-match/head:2", "baseline_unigram_top1", 0.05, 0.03, 0.07, 320)
    _acc(doc, "attacks/linear-probe/head:8", "token_acc_top1", 0.6, 0.5, 0.7, 300)
    _defense(doc, "defenses/head:2/none", (1.0, 0.9, 1.0, 16), (1.0, None, None, 58))
    _defense(doc, "defenses/head:2/noise(sigma=0.05,clip=67.31)", (0.4375, 0.125, 0.6875, 16), (0.155, None, None, 58))
    doc["data"] = {  # the labels a run records, as the suite report reads them
        "attacks": {"rows": [{"attack": "vocab-match", "boundary": "head:2", "corpus": "all",
                              "threat_model": "white-box (exact)"}]},
        "defenses": {"rows": [{"depth": 2, "defense": "noise(sigma=0.05,clip=67.31)",
                               "best": {"attack": "vocab-match-adaptive",
                                        "threat_model": "white-box (exact), adaptive"}}]}}
    return doc


def _gemma() -> dict:  # no data section: attack labels come from the recipe registry
    doc = schema.new_results({"model": "gemma-3-270m", "model_sha256": SHA_B, "seed": 3}, "quick-gemma")
    doc["git_hash"], doc["git_dirty"] = "b" * 40, True
    _acc(doc, "attacks/vocab-match/head:2", "token_acc_top1", 0.5, 0.4, 0.6, 500)
    _acc(doc, "attacks/vocab-match/head:2", "baseline_unigram_top1", 0.04, 0.02, 0.06, 500)
    _defense(doc, "defenses/head:2/none", (0.95, 0.9, 0.99, 20), (1.0, 0.99, 1.0, 80))
    _defense(doc, "defenses/head:2/noise(sigma=0.05,clip=12.5)", (0.25, 0.1, 0.4, 20), (0.3, 0.2, 0.4, 80))
    _defense(doc, "defenses/head:2/quant(format=int8)", (1.0, 0.9, 1.0, 20), (0.9, 0.8, 1.0, 80))
    return doc


@pytest.fixture()
def docs(tmp_path: Path) -> list[Path]:
    return [schema.save(_smollm(), tmp_path / "smollm" / "results.json"),
            schema.save(_gemma(), tmp_path / "gemma" / "results.json")]


def _page(docs: list[Path]) -> str:
    return compare_documents([(str(p), schema.load(p)) for p in docs])


def _line(page: str, start: str) -> str:
    found = [ln for ln in page.splitlines() if ln.startswith(start)]
    assert len(found) == 1, (start, page)
    return found[0]


def test_shared_attack_rows_show_both_models_with_intervals_and_threat_label(docs: list[Path]) -> None:
    page = _page(docs)
    row = _line(page, "| `attacks/vocab-match/head:2` |")
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["`attacks/vocab-match/head:2`", "white-box (exact)", "87.5% [81.2, 93.1] (n=320)",
                     "5.0% [3.0, 7.0] (n=320)", "50.0% [40.0, 60.0] (n=500)", "4.0% [2.0, 6.0] (n=500)"]
    header = _line(page, "| row | threat model |")
    assert "A default (d1e2331f1dc2): top-1" in header and "B gemma-3-270m (7a3bc9e04f11): top-1" in header
    assert "unigram baseline" in header


def test_header_states_paths_commits_dirty_flags_suites_seeds_and_intervals(docs: list[Path]) -> None:
    page = _page(docs)
    a, b = _line(page, "- **A**"), _line(page, "- **B**")
    assert str(docs[0]) in a and "git aaaaaaaaaaaa (clean)" in a and "suite `quick`" in a and "seed 0" in a
    assert str(docs[1]) in b and "git bbbbbbbbbbbb (dirty)" in b and "suite `quick-gemma`" in b and "seed 3" in b
    assert "intervals are per document" in page and "no difference between documents is tested" in page


def test_defense_rows_are_matched_without_their_calibrated_clip(docs: list[Path]) -> None:
    page = _page(docs)
    row = _line(page, "| `defenses/head:2/noise(sigma=0.05)`")
    assert "A: clip=67.31; B: clip=12.5" in row
    assert "vocab-match-adaptive (white-box (exact), adaptive)" in row and "B: not recorded" in row
    assert "43.8% [12.5, 68.8] (n=16)" in row and "15.5% [n/a] (n=58)" in row
    assert "25.0% [10.0, 40.0] (n=20)" in row and "30.0% [20.0, 40.0] (n=80)" in row
    assert "clip=67.31)`" not in page and ")/linear-probe" not in page  # neither unmatched nor attacker sub-rows
    none = _line(page, "| `defenses/head:2/none` |")
    assert "100.0% [90.0, 100.0] (n=16)" in none and "95.0% [90.0, 99.0] (n=20)" in none


def test_match_spec_drops_only_calibrated_parameters() -> None:
    assert match_spec("noise(sigma=0.05,clip=67.31)") == ("noise(sigma=0.05)", ["clip=67.31"])
    assert match_spec("pclip(sigma=0.1,percentile=90.0,profile=ab12)+quant(format=int8)") == \
        ("pclip(sigma=0.1,percentile=90.0)+quant(format=int8)", ["profile=ab12"])
    assert match_spec("noise(clip=8.0,sigma=0.25)") == ("noise(sigma=0.25)", ["clip=8.0"])
    assert match_spec("random-split(depths=2,4,8)") == ("random-split(depths=2,4,8)", [])


def test_two_specs_differing_only_in_clip_keep_their_full_specs() -> None:
    doc = _gemma()
    _defense(doc, "defenses/head:2/noise(sigma=0.05,clip=99.0)", (0.2, 0.1, 0.3, 20), (0.3, 0.2, 0.4, 80))
    assert {k for k in defense_rows(doc) if "noise" in k} == {"defenses/head:2/noise(sigma=0.05,clip=12.5)",
                                                              "defenses/head:2/noise(sigma=0.05,clip=99.0)"}


def test_rows_in_only_some_documents_are_listed_by_name(docs: list[Path]) -> None:
    page = _page(docs)
    rest = page.split("## Not in every document", 1)[1]
    assert "- `attacks/linear-probe/head:8` (in A)" in rest
    assert "- `defenses/head:2/quant(format=int8)` (in B)" in rest
    assert "`attacks/vocab-match/head:2`" not in rest and "noise(sigma=0.05)" not in rest
    table = page.split("## Not in every document", 1)[0]
    assert "linear-probe/head:8" not in table and "quant(format=int8)" not in table


def test_fewer_than_two_documents_are_refused(docs: list[Path], tmp_path: Path) -> None:
    with pytest.raises(SplitInferError, match="at least 2 results documents, got 1"):
        write_comparison(docs[:1], tmp_path / "x.md")
    assert not (tmp_path / "x.md").exists()


def test_a_document_without_attack_or_defense_rows_is_refused(docs: list[Path], tmp_path: Path) -> None:
    bare = tmp_path / "bare" / "results.json"
    schema.save(schema.new_results({"model": "default", "seed": 0}, "ci"), bare)
    with pytest.raises(SplitInferError, match="holds no attack or defense rows"):
        write_comparison([docs[0], bare], tmp_path / "x.md")
    assert not (tmp_path / "x.md").exists()


def test_cli_writes_the_page(docs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "reports" / "cross_model.md"
    assert main(["bench", "compare", str(docs[0]), str(docs[1].parent), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# Cross-model comparison") and "87.5% [81.2, 93.1] (n=320)" in text
    assert f"comparison written to {out}" in capsys.readouterr().out


@pytest.mark.parametrize("which", ["one", "missing", "invalid"])
def test_cli_refuses_bad_input_with_one_line(which: str, docs: list[Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1}')
    args = {"one": [str(docs[0])], "missing": [str(docs[0]), str(tmp_path / "nope.json")],
            "invalid": [str(docs[0]), str(bad)]}[which]
    out = tmp_path / "cmp.md"
    assert main(["bench", "compare", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("splitinfer: error: ") and "Traceback" not in err
    assert {"one": "got 1", "missing": "no such results file", "invalid": "is missing"}[which] in err
    assert not out.exists()
