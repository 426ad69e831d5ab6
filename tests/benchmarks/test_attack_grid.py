"""The attack grid: job planning from recipe class attributes, threat labels, and no caller naming a recipe."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from attacks.errors import AttackError
from attacks.registry import list_attacks
from attacks.boundary import Boundary
from benchmarks.attack_grid import ALIASES, GridConfig, Victim, check_row, plan, row_threat_model

ROOT = Path(__file__).resolve().parents[2]
CALLERS = ("benchmarks/attack_grid.py", "benchmarks/attack_wire.py", "benchmarks/stage_attacks.py",
           "benchmarks/attacks_depth.py", "benchmarks/attacks_depth_cli.py", "attacks/train.py", "attacks/cli.py")


def test_no_caller_branches_on_a_recipe_name() -> None:
    """Issue 17 item 6: callers compared attack names ("vocab-match", "depth-id", "output-probe") to pick a code
    path; options are class attributes (proposer_recipe, scoring, reads, DepthIdentifier) now."""
    names = {r["name"] for r in list_attacks()} | set(ALIASES)
    found = []
    for rel in CALLERS:
        for node in ast.walk(ast.parse((ROOT / rel).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                consts = [c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
                found += [f"{rel}:{node.lineno} {v}" for v in consts if v in names]
    assert not found, found


def test_plan_reads_the_recipe_classes() -> None:
    cfg = GridConfig(head_depths=(1, 2), tail_layers=(2,), attacks=("vocab-match", "linear-probe", "output-probe",
                                                                    "tail-logits", "depth-id"), prefix_depths=(2,))
    depth_of = {Boundary("head", 1): 1, Boundary("head", 2): 2, Boundary("tail", 2): 4}
    jobs = [(j.name, str(j.boundary)) for j in plan(cfg, depth_of)]
    assert jobs == [("linear-probe", "head:1"), ("linear-probe", "head:2"), ("vocab-match", "head:2"),
                    ("output-probe", "tail:2"), ("tail-logits", "tail:2")]  # depth-id: depth_rows; proposer first


def test_shadow_only_against_private_local_layers() -> None:
    private = Victim("lora-random", private_local_layers=True)
    assert row_threat_model("white-box (learned)", Victim()) == "white-box (learned)"
    assert row_threat_model("white-box (learned)", private) == "shadow"
    assert row_threat_model("paired", private) == "paired"
    assert check_row({"threat_model": "shadow"}, private)
    with pytest.raises(AttackError, match="labelled shadow"):
        check_row({"attack": "mlp", "boundary": "head:2", "threat_model": "shadow"}, Victim())


def test_extract_split_keeps_ten_test_documents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the defenses stage took its test tokens from the first long documents (the full suite's
    lora-private row scored vocab-match on one prose document: no interval); both grids cut them now."""
    import json

    from benchmarks.attack_grid import extract_split
    from splitinfer.models import load_model

    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "long.jsonl"
    words = " ".join(f"word{j} and more" for j in range(60))  # ~180+ tokens per document
    path.write_text("\n".join(json.dumps({"doc_id": f"d{i}", "text": f"Doc {i}: {words}"}) for i in range(200)),
                    encoding="utf-8")
    head = Boundary("head", 1)
    taps = extract_split(load_model("tiny-random"), f"file:{path}", [head], "test", 200, 64)[head]
    assert len(set(taps.seq_doc.tolist())) >= 10 and taps.n_tokens <= 200
