"""seq-decoder: fits synthetic taps, uses context, round-trips, trains under `accelerate launch` (2 CPU processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attacks.registry import load_attack, make_attack
from attacks.tapdata import Taps
from tests.attacks.synth import accuracy, make_taps

SMALL = {"d_model": 32, "layers": 1, "heads": 2, "d_ff": 64, "epochs": 15, "batch_size": 8, "lr": 3e-3}


def context_taps(seed: int, n_seqs: int = 60) -> Taps:
    """Sequences a, b, a, b, ... where only the even positions' states carry information: odd tokens need context."""
    t = make_taps(n_seqs=n_seqs, seq_len=8, vocab=20, d=16, noise=0.2, seed=seed, first_doc=1000 * seed)
    ids = t.token_ids.reshape(n_seqs, 8).copy()
    ids[:, 1::2] = (ids[:, 0::2] + 1) % 20  # the odd token is determined by its left neighbour
    hidden = t.hidden.reshape(n_seqs, 8, -1).copy()
    hidden[:, 1::2] = np.random.default_rng(seed).normal(size=hidden[:, 1::2].shape)  # pure noise
    return Taps(hidden.reshape(n_seqs * 8, -1), ids.reshape(-1), t.seq_lengths, t.seq_doc, t.documents, None, t.meta)


def test_seq_decoder_uses_context_beyond_a_token_probe(tmp_path) -> None:
    train, test = context_taps(0, 120), context_taps(1)
    seq = make_attack("seq-decoder", seed=0, **SMALL).fit(train, context_taps(2))
    probe = make_attack("linear-probe", epochs=15, batch_size=32, lr=0.01).fit(train)
    odd = test.positions() % 2 == 1
    seq_inv, probe_inv = seq.invert(test), probe.invert(test)
    seq_odd = float((seq_inv.tokens == test.token_ids)[odd].mean())
    probe_odd = float((probe_inv.tokens == test.token_ids)[odd].mean())
    assert accuracy(seq_inv, test) > 0.7 and seq_odd > probe_odd + 0.3
    again = load_attack(seq.save(tmp_path / "seq"))
    assert np.array_equal(again.invert(test).topk, seq_inv.topk)


def test_seq_decoder_training_resumes_from_its_checkpoint(tmp_path) -> None:
    from attacks.trainer import TrainConfig

    train = make_taps(n_seqs=20, seed=0)
    cfg = TrainConfig(checkpoint_dir=str(tmp_path), epochs=2, progress=False)
    first = make_attack("seq-decoder", **SMALL).fit(train, trainer=cfg)
    assert (tmp_path / "seq-decoder-train.safetensors").is_file() and first.fit_report["epochs_run"] == 2
    cfg3 = TrainConfig(checkpoint_dir=str(tmp_path), epochs=3, progress=False)
    # a different epoch count is a different run: starts over
    assert make_attack("seq-decoder", **SMALL).fit(train, trainer=cfg3).fit_report["epochs_run"] == 3
    again = make_attack("seq-decoder", **SMALL).fit(train, trainer=cfg3)  # same run, finished: nothing left to do
    assert again.fit_report["epochs_run"] == 3 and again.fit_report["train_seconds"] < 1.0


@pytest.fixture
def pii_corpus(tmp_path: Path) -> str:
    docs = [{"doc_id": f"d{i}", "text": f"Patient {name} called about the invoice number {i * 7919}.",
             "pii_spans": [{"start": 8, "end": 8 + len(name), "type": "person"}]}
            for i, name in enumerate(["Ann Lee", "Bob Stone", "Cy Young", "Dee Park", "Eve Moss", "Flo Hart"] * 4)]
    path = tmp_path / "pii.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in docs), encoding="utf-8")
    return f"file:{path}"


@pytest.mark.slow  # `make test-all` (not in CI: the 20-minute budget)
def test_accelerate_launch_two_cpu_processes(tmp_path: Path, pii_corpus: str, tiny) -> None:
    """`accelerate launch --multi_gpu --num_processes 2` on CPU: two gloo processes train one checkpoint."""
    out = tmp_path / "ckpt"
    env = {**os.environ, "SPLITINFER_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
           "-m", "splitinfer.cli",
           "attack", "train", "--attack", "seq-decoder", "--model", "tiny-random", "--boundary", "head:2",
           "--corpus", pii_corpus, "--max-tokens", "600", "--epochs", "2", "--max-length", "32",
           "--attack-option", "d_model=32", "--attack-option", "layers=1", "--attack-option", "d_ff=64",
           "--out", str(out), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=Path(__file__).parents[3])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["fit_report"]["processes"] == 2 and summary["fit_report"]["epochs_run"] == 2
    attack = load_attack(out, model=tiny)  # the embedding backoff needs the model
    assert attack.name == "seq-decoder" and attack.meta["boundary"] == "head:2"
    assert attack.fit_report["backoff"] == "embed"
