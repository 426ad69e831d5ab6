"""Smoke test of the extraction-speed benchmark on the tiny model (figures are not checked: the machine is shared)."""

from __future__ import annotations

from benchmarks.extract_speed import format_extract_speed, plain_forward, run_extract_speed


def test_run_extract_speed_smoke(tiny, tmp_path, monkeypatch) -> None:
    import json

    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path))
    docs = tmp_path / "docs.jsonl"
    docs.write_text("\n".join(json.dumps({"text": f"Document {i}. " + "words and more words " * 20}) for i in range(4)))
    result = run_extract_speed(tiny, depths=(1, 3), corpus=f"file:{docs}", n_tokens=600, max_length=128, repeats=1)
    assert [r["boundary"] for r in result["rows"]] == ["head:1", "head:3"]
    for r in result["rows"]:
        assert r["tokens"] == 600 and r["plain_tok_s"] > 0 and r["extract_tok_s"] > 0 and r["ratio_cpu"] > 0 and r["estimated_ratio"] > 0
        assert r["max_abs_diff_fp16"] == 0.0  # the runtime's layer runner = the plain forward, bit for bit
    assert "head:3" in format_extract_speed(result)


def test_plain_forward_shape(tiny) -> None:
    import torch

    out = plain_forward(tiny.model, 2, torch.randint(0, 200, (2, 7)))
    assert out.shape == (2, 7, tiny.hidden_size)
