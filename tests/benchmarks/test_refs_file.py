"""The decoding references file (:mod:`benchmarks.refs_file`): round trip, and no pickle read (issue 30, finding 8)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from benchmarks.refs_file import load_refs, save_refs
from splitinfer.errors import SplitInferError

REPO = Path(__file__).resolve().parents[2]


def test_references_round_trip(tmp_path):
    gen = torch.Generator().manual_seed(0)
    data = {"max_new_tokens": 8, "eos": [2], "vocab_size": 50, "model_sha256": "ab",
            "refs": [{"category": "code", "ids": [1, 5, 7], "output": [3, 2],
                      "topk": (torch.randint(0, 50, (5, 4), generator=gen), torch.rand(5, 4, generator=gen)),
                      "prompt_lookup": {"tokens": 2, "forwards": 1, "tau": 2.0, "token_identical": True}}]}
    save_refs(data, tmp_path / "refs.st")
    back = load_refs(tmp_path / "refs.st")
    assert {k: v for k, v in back.items() if k != "refs"} == {k: v for k, v in data.items() if k != "refs"}
    ref, want = back["refs"][0], data["refs"][0]
    assert {k: v for k, v in ref.items() if k != "topk"} == {k: v for k, v in want.items() if k != "topk"}
    assert all(torch.equal(a, b) for a, b in zip(ref["topk"], want["topk"]))


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_pickle_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "refs.pt"
    path.write_bytes(pickle.dumps({"refs": [_Payload(marker)]}))
    with pytest.raises(SplitInferError, match="pickles are not read"):
        load_refs(path)
    assert not marker.exists()


def test_no_code_loads_with_weights_only_false():
    """``torch.load`` with ``weights_only`` switched off runs whatever a crafted file holds."""
    needle = "weights_only=" + "False"
    hits = [str(p.relative_to(REPO)) for d in ("splitinfer", "attacks", "benchmarks", "tests", "scripts")
            if (REPO / d).is_dir() for p in (REPO / d).rglob("*.py") if needle in p.read_text(errors="ignore")]
    assert hits == []
