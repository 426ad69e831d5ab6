"""The attack interface: registry, Inversion, taps adapter, save/load, bad checkpoints, mismatches, scoring."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from attacks.base import CONFIG_NAME, TENSORS_NAME, Inversion, InversionAttack
from attacks.errors import AttackError
from attacks.evaluate import flat_report, prior_tokens, score
from attacks.registry import get_attack_class, list_attacks, load_attack, make_attack, register_attack
from attacks.tapdata import Taps, as_taps
from tests.attacks.synth import accuracy, make_taps

FAST = {"epochs": 10, "batch_size": 32, "lr": 0.01}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    train, test = make_taps(seed=0), make_taps(seed=1, first_doc=100)
    attack = make_attack("linear-probe", seed=0, **FAST).fit(train)
    path = attack.save(tmp_path_factory.mktemp("ckpt") / "lp")
    return attack, path, test


# ---------------------------------------------------------------------------- registry


def test_registry_lists_every_recipe_with_threat_model() -> None:
    rows = {r["name"]: r for r in list_attacks()}
    expected = {"linear-probe", "linear-embed", "mlp", "seq-decoder", "vocab-match", "vocab-match-adaptive",
                "vocab-match-fitted", "output-probe", "depth-id", "tail-logits"}
    assert expected <= set(rows)
    assert all(rows[n]["threat_model"] == "white-box (exact)" for n in expected if n.startswith("vocab-match"))
    assert rows["vocab-match"]["requires"] == ["head_weights"]
    assert rows["output-probe"]["boundary_side"] == "tail"
    # DESIGN.md section 4: against the undefended (published-weights) victim every recipe is white-box;
    # no recipe declares shadow, which only labels results against a privately changed victim
    learned = ("linear-probe", "linear-embed", "mlp", "seq-decoder", "output-probe", "depth-id")
    assert all(rows[n]["threat_model"] == "white-box (learned)" for n in learned)
    assert all(r["threat_model"] in ("white-box (exact)", "white-box (learned)", "paired") for r in rows.values())


def test_a_recipe_cannot_declare_shadow() -> None:
    from attacks.registry import register_attack

    class Shadowy(InversionAttack):
        threat_model = "shadow"

    with pytest.raises(AttackError, match="shadow labels results"):
        register_attack("shadowy")(Shadowy)


def test_unknown_attack_and_hparam_are_clear_errors() -> None:
    with pytest.raises(AttackError, match="unknown attack 'nope'.*linear-probe"):
        make_attack("nope")
    with pytest.raises(AttackError, match="no hyper-parameter.*'bogus'"):
        make_attack("linear-probe", bogus=1)
    with pytest.raises(AttackError, match="protocol"):
        make_attack("mlp", protocol="weird")
    # hyper-parameters take their default's type when the attack is made, before any extraction
    with pytest.raises(AttackError,
                       match=r"linear-probe epochs='abc' must be an integer; e.g. epochs=8 \(--attack-option epochs=8\)"):
        make_attack("linear-probe", epochs="abc")
    with pytest.raises(AttackError, match=r"lr=nan must be a finite number"):
        make_attack("linear-probe", lr=float("nan"))
    assert make_attack("linear-probe", epochs="3").hparams["epochs"] == 3


def test_register_rejects_bad_declarations() -> None:
    class Bad(InversionAttack):
        threat_model = "omniscient"

    with pytest.raises(AttackError, match="threat model 'omniscient'"):
        register_attack("bad-threat")(Bad)
    assert get_attack_class("linear-probe").name == "linear-probe"


def test_inversion_checks_shapes() -> None:
    inv = Inversion(np.array([1, 2]), np.array([[1, 3], [2, 4]]), np.zeros((2, 2)))
    assert inv.tokens.dtype == np.int64
    with pytest.raises(AttackError, match="bad Inversion"):
        Inversion(np.array([1, 2]), np.array([[1, 3]]), np.zeros((1, 2)))


# ---------------------------------------------------------------------------- taps adapter


def test_taps_helpers() -> None:
    t = make_taps(n_seqs=3, seq_len=4)
    assert t.n_tokens == 12 and len(t) == 3
    assert t.positions().tolist() == [0, 1, 2, 3] * 3
    nxt = t.next_token_ids(-1)
    assert nxt[3] == -1 and nxt[0] == t.token_ids[1]
    sub = t.select_sequences([2, 0])
    assert sub.n_tokens == 8 and sub.token_ids[:4].tolist() == t.token_ids[8:].tolist()
    both = Taps.concat([t, make_taps(n_seqs=2, seq_len=4, seed=5)])
    assert both.n_tokens == 20 and len(both.documents) == 5 and both.seq_doc.tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(AttackError, match="different boundary"):
        Taps.concat([t, make_taps(boundary="head:3")])
    with pytest.raises(AttackError, match="expected taps"):
        as_taps(np.zeros((3, 4)))
    with pytest.raises(AttackError, match="sum to"):
        Taps(np.zeros((4, 2)), np.zeros(4), [3], [0], [{}])


def test_taps_from_tapset(tiny, tmp_path, monkeypatch) -> None:
    from attacks.taps import extract_taps

    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "docs.jsonl"
    docs = [{"doc_id": "a", "text": "Call Ann at 555-1234.", "pii_spans": [{"start": 5, "end": 8, "type": "person"}]},
            {"doc_id": "b", "text": "Another short document."}]
    path.write_text("\n".join(json.dumps(d) for d in docs), encoding="utf-8")
    ts = extract_taps(tiny, f"file:{path}", "head:2", progress=False)
    taps = as_taps(ts)
    assert taps.n_tokens == ts.n_tokens and taps.boundary == "head:2" and taps.model_sha256 == tiny.sha256
    assert np.array_equal(taps.token_ids, ts.token_ids()) and taps.offsets.shape == (taps.n_tokens, 2)
    assert taps.documents[0]["pii_spans"][0]["type"] == "person"


# ---------------------------------------------------------------------------- fit / invert / save / load


def test_fit_invert_beats_uniform(fitted) -> None:
    attack, _, test = fitted
    inv = attack.invert(test, k=5)
    assert inv.topk.shape == (test.n_tokens, 5) and np.array_equal(inv.tokens, inv.topk[:, 0])
    assert accuracy(inv, test) > 0.9 > 1 / 40


def test_save_load_round_trip_is_identical(fitted) -> None:
    attack, path, test = fitted
    assert (path / CONFIG_NAME).is_file() and (path / TENSORS_NAME).is_file()
    assert not list(path.glob("*.pt")) and not list(path.glob("*.pkl"))
    cfg = json.loads((path / CONFIG_NAME).read_text())
    assert cfg["recipe"] == "linear-probe" and cfg["meta"]["model_sha256"] == "0" * 64
    assert cfg["meta"]["boundary"] == "head:2" and cfg["seed"] == 0 and cfg["hparams"]["epochs"] == 10
    again = load_attack(path)
    a, b = attack.invert(test), again.invert(test)
    assert np.array_equal(a.topk, b.topk) and np.allclose(a.scores, b.scores)


def test_not_fitted_and_bad_k() -> None:
    with pytest.raises(AttackError, match="not fitted"):
        make_attack("linear-probe").invert(make_taps())
    with pytest.raises(AttackError, match="not fitted"):
        make_attack("linear-probe").save("/tmp/never")


def test_mismatched_model_or_boundary_is_an_error(fitted) -> None:
    attack, _, _ = fitted
    with pytest.raises(AttackError, match="model mismatch"):
        attack.invert(make_taps(sha="f" * 64))
    with pytest.raises(AttackError, match="boundary mismatch.*head:2.*head:3"):
        attack.invert(make_taps(boundary="head:3"))
    with pytest.raises(AttackError, match="attacks the head boundary.*tail:2"):
        attack.invert(make_taps(boundary="tail:2"))
    with pytest.raises(AttackError, match="hidden size mismatch"):
        attack.invert(make_taps(d=16))


def test_bad_checkpoints_are_clear_errors(fitted, tmp_path) -> None:
    _, path, _ = fitted
    with pytest.raises(AttackError, match="does not exist"):
        load_attack(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(AttackError, match="not an attack checkpoint"):
        load_attack(empty)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / CONFIG_NAME).write_text((path / CONFIG_NAME).read_text())
    (bad / TENSORS_NAME).write_bytes(b"not safetensors at all")
    with pytest.raises(AttackError, match="unreadable or not safetensors"):
        load_attack(bad)
    (bad / CONFIG_NAME).write_text("{not json")
    with pytest.raises(AttackError, match="cannot read"):
        load_attack(bad)
    cfg = json.loads((path / CONFIG_NAME).read_text())
    (bad / TENSORS_NAME).write_bytes((path / TENSORS_NAME).read_bytes())
    (bad / CONFIG_NAME).write_text(json.dumps({**cfg, "format_version": 99}))
    with pytest.raises(AttackError, match="format version 99"):
        load_attack(bad)
    (bad / CONFIG_NAME).write_text(json.dumps({**cfg, "recipe": "mlp"}))
    with pytest.raises(AttackError, match="does not match recipe 'mlp'"):
        load_attack(bad)
    (bad / CONFIG_NAME).write_text(json.dumps({**cfg, "state": {**cfg["state"], "n_classes": 3}}))
    with pytest.raises(AttackError, match="does not match"):
        load_attack(bad)


def test_load_checks_the_model_sha(fitted, tiny) -> None:
    _, path, _ = fitted
    with pytest.raises(AttackError, match="model mismatch"):
        load_attack(path, model=tiny)


def test_empty_taps_are_an_error() -> None:
    t = make_taps(n_seqs=1, seq_len=1)
    with pytest.raises(AttackError, match="zero sequences"):
        t.select_sequences([])
    with pytest.raises(AttackError, match="empty"):
        as_taps([])


# ---------------------------------------------------------------------------- scoring


def test_score_and_flat_report(fitted) -> None:
    attack, _, test = fitted
    inv = attack.invert(test)
    summary = score(inv, test, vocab_size=40, train_token_ids=prior_tokens(attack.meta["unigram_top"]), n_boot=100)
    assert summary["token_acc_top1"]["value"] == pytest.approx(accuracy(inv, test))
    top1 = summary["token_acc_top1"]
    assert top1["ci_low"] <= top1["value"] <= top1["ci_high"]
    assert summary["baseline_uniform_top1"]["value"] == pytest.approx(1 / 40)
    report = flat_report(summary, attack="linear-probe")
    for key in ("token_acc_top1", "token_acc_top5", "token_f1", "exact_match", "n_tokens", "ci95"):
        assert key in report
    assert report["n_tokens"] == test.n_tokens and report["n_documents"] == 40


def test_a_checkpoint_path_that_is_a_file_says_so(tmp_path: Path) -> None:
    from attacks.base import read_config

    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(AttackError, match="is a file; point --attacker at the directory"):
        read_config(afile)
