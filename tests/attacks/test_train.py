"""`splitinfer attack train | eval | list` on the tiny model and a file: corpus with PII spans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from splitinfer.cli import main

NAMES = ["Ann Lee", "Bob Stone", "Cy Young", "Dee Park", "Eve Moss", "Flo Hart", "Gus Fry", "Hal Dunn"]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def corpus(tmp_path: Path) -> str:
    docs = []
    for i, name in enumerate(NAMES * 3):
        text = f"Patient {name} (email {name.split()[0].lower()}@example.org) called about invoice {i * 7919}."
        email = text.index("(email ") + len("(email ")
        docs.append({"doc_id": f"d{i}", "text": text, "pii_spans": [
            {"start": 8, "end": 8 + len(name), "type": "person"},
            {"start": email, "end": text.index(")"), "type": "email"}]})
    path = tmp_path / "pii.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in docs), encoding="utf-8")
    return f"file:{path}"


def last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_list(capsys) -> None:
    assert main(["attack", "list"]) == 0
    out = capsys.readouterr().out
    assert "vocab-match" in out and "white-box" in out and "seq-decoder" in out
    assert main(["attack", "list", "--json"]) == 0
    assert {r["name"] for r in last_json(capsys)} >= {"linear-probe", "mlp", "depth-id"}


def test_train_then_eval_json(tmp_path: Path, corpus: str, capsys) -> None:
    out = tmp_path / "lp"
    assert main(["attack", "train", "--attack", "linear-probe", "--model", "tiny-random", "--boundary", "head:2",
                 "--corpus", corpus, "--max-tokens", "2000", "--epochs", "3", "--batch-size", "32",
                 "--out", str(out), "--json"]) == 0
    summary = last_json(capsys)
    assert summary["boundary"] == "head:2" and summary["fit_report"]["epochs_run"] == 3
    assert (out / "config.json").is_file() and (out / "attack.safetensors").is_file()
    assert (out / "checkpoints" / "linear-probe-train.safetensors").is_file()
    assert main(["attack", "eval", "--attacker", str(out), "--corpus", corpus, "--json"]) == 0
    report = last_json(capsys)
    for key in ("token_acc_top1", "token_acc_top5", "token_f1", "exact_match", "n_tokens", "ci95", "pii_recovery"):
        assert key in report, key
    assert set(report["pii_recovery"]) == {"person", "email"} and report["model"] == "tiny-random"
    assert 0.0 <= report["token_acc_top1"] <= report["token_acc_top5"] <= 1.0
    assert report["ci95"]["token_acc_top1"][0] <= report["token_acc_top1"] <= report["ci95"]["token_acc_top1"][1]
    # resume: the same run again finds its finished checkpoint
    assert main(["attack", "train", "--attack", "linear-probe", "--model", "tiny-random", "--boundary", "head:2",
                 "--corpus", corpus, "--max-tokens", "2000", "--epochs", "3", "--batch-size", "32",
                 "--out", str(out), "--json"]) == 0
    assert last_json(capsys)["fit_report"]["train_seconds"] < 1.0


def test_eval_errors(tmp_path: Path, corpus: str, capsys) -> None:
    assert main(["attack", "eval", "--attacker", str(tmp_path / "nope"), "--corpus", corpus]) == 2
    assert "does not exist" in capsys.readouterr().err
    out = tmp_path / "vm"
    assert main(["attack", "train", "--attack", "vocab-match", "--model", "tiny-random", "--boundary", "head:1",
                 "--corpus", corpus, "--max-tokens", "500", "--hparam", "random_tokens=256", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["attack", "eval", "--attacker", str(out), "--corpus", corpus, "--boundary", "head:2"]) == 2
    assert "boundary mismatch" in capsys.readouterr().err
    assert main(["attack", "train", "--attack", "mlp", "--model", "tiny-random", "--boundary", "head:9",
                 "--corpus", corpus, "--out", str(tmp_path / "x")]) == 2
    assert "outside the model" in capsys.readouterr().err
    assert main(["attack", "train", "--attack", "mlp", "--model", "tiny-random", "--boundary", "head:1",
                 "--corpus", corpus, "--hparam", "nonsense", "--out", str(tmp_path / "x")]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_depth_id_train_and_eval(tmp_path: Path, corpus: str, capsys) -> None:
    out = tmp_path / "did"
    assert main(["attack", "train", "--attack", "depth-id", "--model", "tiny-random", "--boundary", "head:1,head:4",
                 "--corpus", corpus, "--max-tokens", "800", "--epochs", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["attack", "eval", "--attacker", str(out), "--corpus", corpus, "--boundary", "head:4", "--json"]) == 0
    report = last_json(capsys)
    assert report["depth"] == 4 and 0.0 <= report["depth_token_acc"] <= 1.0 and report["attack"] == "depth-id"
    assert main(["attack", "eval", "--attacker", str(out), "--corpus", corpus]) == 2
    assert "pass --boundary" in capsys.readouterr().err


def test_eval_scores_a_next_token_attacker_against_the_following_tokens(tmp_path: Path, corpus: str, capsys) -> None:
    """Regression: `attack eval` compared output-probe's next-token guesses with the tokens at the same rows."""
    out = tmp_path / "op"
    assert main(["attack", "train", "--attack", "output-probe", "--model", "tiny-random", "--boundary", "tail:2",
                 "--corpus", corpus, "--max-tokens", "400", "--out", str(out), "--hparam", "epochs=1"]) == 0
    assert main(["attack", "eval", "--attacker", str(out), "--corpus", corpus, "--max-tokens", "200",
                 "--json"]) == 0
    report = last_json(capsys)
    assert report["attack"] == "output-probe" and report["n_tokens"] < 200  # the last token of a sequence: no target


def test_bad_attack_options_fail_in_one_line_before_any_extraction(tmp_path: Path, capsys) -> None:
    missing = f"file:{tmp_path / 'missing.jsonl'}"  # extracting it would fail with another message
    for opt, message in (("beam=0", "lm-beam beam=0; give an integer >= 1"),
                         ("base=vocab-match", "is not a learned per-token attacker"),
                         ("beam=abc", "lm-beam beam='abc' must be an integer; e.g. beam=4")):
        assert main(["attack", "train", "--attack", "lm-beam", "--attack-option", opt, "--model", "tiny-random",
                     "--boundary", "head:2", "--corpus", missing, "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert message in err and err.strip().count("\n") == 0
    (tmp_path / "afile").write_text("x")
    assert main(["attack", "train", "--attack", "linear-probe", "--model", "tiny-random", "--boundary", "head:2",
                 "--corpus", missing, "--out", str(tmp_path / "afile" / "ckpt")]) == 2
    assert f"{tmp_path / 'afile'} is a file; give a directory path" in capsys.readouterr().err


def test_eval_labels_the_attackers_knowledge_of_a_defended_victim(tmp_path: Path, corpus: str, capsys) -> None:
    # DESIGN.md section 4: public weights against private local layers is shadow; knowing the defense, adaptive
    out = tmp_path / "lp"
    noise = "noise(sigma=0.05,clip=8.0)"
    assert main(["attack", "train", "--attack", "linear-probe", "--model", "tiny-random", "--boundary", "head:2",
                 "--corpus", corpus, "--max-tokens", "1000", "--epochs", "1", "--defense", noise,
                 "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    labels = {}
    for victim in (noise, f"lora-random(rank=2,scale=0.2)+{noise}", "none"):
        assert main(["attack", "eval", "--attacker", str(out), "--corpus", corpus, "--max-tokens", "200",
                     "--defense", victim, "--json"]) == 0
        labels[victim] = last_json(capsys)["threat_model"]
    assert labels == {noise: "white-box (learned), adaptive", "none": "white-box (learned)",
                      f"lora-random(rank=2,scale=0.2)+{noise}": "shadow, adaptive"}
