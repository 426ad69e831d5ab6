"""Artefacts on disk survive crashes (issue 16 item 6): the atomic-write helper and every runtime writer.

A failure is injected between the write and the rename (``atomic._commit``),
and one real ``kill -9`` hits a writer at that moment; afterwards no later
command may trust a corrupt artefact: it is absent, rebuilt, or refused with a
one-line error naming the file and the fix.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from splitinfer import atomic, models
from splitinfer.errors import SplitInferError
from tests.splitinfer.ws_helpers import REPO


class Injected(RuntimeError):
    pass


@pytest.fixture
def fail_commit(monkeypatch):
    def boom(tmp, target):
        raise Injected(f"crash before renaming onto {target}")

    monkeypatch.setattr(atomic, "_commit", boom)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _leftovers(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.endswith((".tmp", ".old"))] if directory.exists() else []


# ---------------------------------------------------------------------------- the helper
def test_write_is_all_or_nothing(tmp_path, monkeypatch):
    target = tmp_path / "out.json"
    atomic.write_json(target, {"v": 1})
    monkeypatch.setattr(atomic, "_commit", lambda tmp, dst: (_ for _ in ()).throw(Injected("crash")))
    with pytest.raises(Injected):
        atomic.write_json(target, {"v": 2})
    assert json.loads(target.read_text()) == {"v": 1} and _leftovers(tmp_path) == []


def test_directory_is_marked_complete_last(tmp_path, fail_commit):
    out = tmp_path / "d"
    with pytest.raises(Injected):
        with atomic.atomic_dir(out) as tmp:
            (tmp / "weights.bin").write_bytes(b"x" * 100)
    assert not out.exists() and not atomic.is_complete(out) and _leftovers(tmp_path) == []


def test_guard_overwrite(tmp_path):
    cfg = tmp_path / "c.json"
    atomic.guard_overwrite(cfg, {"a": 1}, "run", False, "a thing")  # nothing there yet
    atomic.write_json(cfg, {"run": {"a": 1}})
    atomic.guard_overwrite(cfg, {"a": 1}, "run", False, "a thing")
    with pytest.raises(SplitInferError, match="different run; pass --force"):
        atomic.guard_overwrite(cfg, {"a": 2}, "run", False, "a thing")
    atomic.guard_overwrite(cfg, {"a": 2}, "run", True, "a thing")


# ---------------------------------------------------------------------------- model caches
def test_tiny_random_cache_write_that_fails_is_rebuilt(cache, monkeypatch):
    saved = atomic._commit
    monkeypatch.setattr(atomic, "_commit", lambda tmp, dst: (_ for _ in ()).throw(Injected("crash")))
    with pytest.raises(Injected):
        models.tiny_random_dir(0)
    with pytest.raises(models.NeedsPreparation):
        models.tiny_random_dir(0, prepare=False)  # nothing half-written is taken for a cache
    monkeypatch.setattr(atomic, "_commit", saved)
    out = models.tiny_random_dir(0)
    assert atomic.is_complete(out) and _leftovers(out.parent) == []


def test_truncated_cache_gives_one_line_error(cache):
    out = models.tiny_random_dir(0)
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(SplitInferError, match=r"model cache .* is corrupt \(model.safetensors .*delete the directory"):
        models.tiny_random_dir(0)


def test_cache_from_before_markers_is_adopted_or_rebuilt(cache):
    out = models.tiny_random_dir(0)
    (out / atomic.MARKER).unlink()
    assert models.tiny_random_dir(0, prepare=False) == out and atomic.is_complete(out)  # intact: adopted
    (out / atomic.MARKER).unlink()
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # the old bug: config.json written, weights cut short
    with pytest.raises(models.NeedsPreparation):
        models.tiny_random_dir(0, prepare=False)
    assert atomic.safetensors_intact(models.tiny_random_dir(0) / "model.safetensors") is None


def test_serve_with_a_corrupt_cache_says_what_to_do(cache):
    out = models.tiny_random_dir(0)
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    env = {**os.environ, "SPLITINFER_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "splitinfer.cli", "serve", "--model", "tiny-random", "--port", "0"],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "corrupt" in r.stderr and f"rm -r {out}" in r.stderr


def test_gguf_conversion_ignores_leftovers(cache, monkeypatch, tiny):
    """A leftover conversion directory (from a crash, old or new naming) does not break the conversion.

    The converter is replaced by one that writes the tiny model (a real GGUF conversion: test_real_model)."""
    name = "gguf-fake"
    root = cache / "models"
    (root / f"{name}.tmp").mkdir(parents=True)  # the old code's fixed temporary name
    (root / f"{name}.tmp" / "config.json").write_text("{}")
    (root / f".{name}.abc.tmp").mkdir()
    (root / name).mkdir()  # a directory left by an interrupted write: no marker, no weights
    (root / name / "config.json").write_text("{}")
    for old in (root / f"{name}.tmp", root / f".{name}.abc.tmp"):
        os.utime(old, (1e9, 1e9))  # left long ago (a live writer's fresh files are spared)
    real_dir = atomic.atomic_dir

    def convert(gguf, out_dir):
        with real_dir(out_dir) as tmp:
            tiny.model.save_pretrained(tmp)

    monkeypatch.setattr(models, "_convert_gguf", convert)
    out = models.cached_gguf_dir(name, Path("unused.gguf"))
    assert atomic.is_complete(out) and (out / "model.safetensors").is_file()
    assert _leftovers(root) == []


# ---------------------------------------------------------------------------- one real kill -9
KILL_CHILD = """
import os, sys, time
from splitinfer import atomic, models
real = atomic._commit
def slow(tmp, target):
    print("WRITTEN", flush=True)   # every byte is written; the rename has not happened
    time.sleep(60)
    real(tmp, target)
atomic._commit = slow
models.tiny_random_dir(0)
"""


def test_kill_9_between_write_and_rename(cache):
    env = {**os.environ, "SPLITINFER_CACHE": str(cache), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", KILL_CHILD], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        assert child.stdout.readline().strip() == "WRITTEN"
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        child.kill()
    with pytest.raises(models.NeedsPreparation):  # what the server checks before loading: not trusted
        models.tiny_random_dir(0, prepare=False)
    out = models.tiny_random_dir(0)  # the next preparation rebuilds it and sweeps the leftover
    assert atomic.is_complete(out) and _leftovers(out.parent) == []


# ---------------------------------------------------------------------------- draft artefacts
def test_bridge_calibration(tmp_path, monkeypatch):
    from splitinfer.decoding.bridge import RidgeBridge

    bridge = RidgeBridge(4, 1.0)
    bridge.G, bridge.C, bridge.n = torch.eye(5, dtype=torch.float64), torch.zeros(5, 4, dtype=torch.float64), 10
    meta = {"model_sha256": "a" * 64, "split": "2,2", "num_layers": 6, "corpora": "prose", "wire_dtype": "fp16"}
    bridge.save(tmp_path / "b", meta)
    with pytest.raises(SplitInferError, match="different run; pass --force"):
        bridge.save(tmp_path / "b", {**meta, "model_sha256": "b" * 64})
    monkeypatch.setattr(atomic, "_commit", lambda tmp, dst: (_ for _ in ()).throw(Injected("crash")))
    with pytest.raises(Injected):
        bridge.save(tmp_path / "b", meta)
    with pytest.raises(SplitInferError, match="no bridge calibration"):  # no JSON: not taken for a calibration
        RidgeBridge.load(tmp_path / "b")


def test_feature_head(tmp_path, monkeypatch, feature_head_dir):
    from splitinfer.decoding.feature_head import head_files, load_head, save_head

    head, info = load_head(feature_head_dir)
    meta = {k: v for k, v in info.items() if k not in ("format", "version", "hidden_size", "mlp_hidden", "run")}
    out = tmp_path / "head"
    save_head(head, out, meta)
    save_head(head, out, meta)  # the same run again: fine
    with pytest.raises(SplitInferError, match="different run; pass --force"):
        save_head(head, out, {**meta, "steps": meta["steps"] + 1})
    save_head(head, out, {**meta, "steps": meta["steps"] + 1}, force=True)
    monkeypatch.setattr(atomic, "_commit", lambda tmp, dst: (_ for _ in ()).throw(Injected("crash")))
    with pytest.raises(Injected):
        save_head(head, out, {**meta, "steps": meta["steps"] + 1})
    with pytest.raises(SplitInferError, match="no trained feature-draft head"):
        load_head(out)
    assert not [p for p in head_files(out)[0].parent.iterdir() if p.name.endswith(".tmp")]


def test_weights_are_prepared_by_a_public_entry_point(cache, capsys):
    """`serve` prepares weights in a child process through `python -m splitinfer.body_weights`."""
    from splitinfer import body_weights

    with pytest.raises(models.NeedsPreparation):
        models.resolve_weights_dir("tiny-random", prepare=False)
    out = body_weights.weights_dir("tiny-random")  # runs the child process
    assert atomic.is_complete(out) and out == models.prepare_weights("tiny-random")
    assert body_weights.main(["tiny-random", "0"]) == 0 and capsys.readouterr().out.strip() == str(out)
    assert body_weights.main(["tiny-random", "zero"]) == 1
