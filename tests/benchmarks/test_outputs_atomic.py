"""Bench outputs are written atomically (issue 16 item 6): a crash before the rename keeps the previous file."""

from __future__ import annotations

import json

import pytest

from splitinfer import atomic


class Injected(RuntimeError):
    pass


def test_bench_json_output_is_atomic(tmp_path, monkeypatch):
    from benchmarks.decoding import save

    save({"v": 1}, tmp_path)
    monkeypatch.setattr(atomic, "_commit", lambda tmp, dst: (_ for _ in ()).throw(Injected("crash")))
    with pytest.raises(Injected):
        save({"v": 2}, tmp_path)
    assert json.loads((tmp_path / "decoding.json").read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["decoding.json"]  # no temporary file left
