"""Attack checkpoints, training checkpoints and tap stores on disk (issue 16 item 6).

Each write path gets a failure injected between the write and the rename
(``splitinfer.atomic._commit``): afterwards no artefact that a later command
trusts may be corrupt. A resumed training run must be the same run (data,
boundary, model, hyper-parameters), and ``save`` must not overwrite another
run's checkpoint without ``force``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from attacks.base import CONFIG_NAME, TENSORS_NAME
from attacks.errors import AttackError
from attacks.registry import load_attack, make_attack
from attacks.tapstore import INDEX_NAME, TapSet, read_shard_header
from attacks.trainer import TrainConfig
from splitinfer import atomic
from tests.attacks.synth import make_taps

FAST = {"epochs": 3, "batch_size": 32, "lr": 0.01}
MLP = {**FAST, "width": 64}


class Injected(RuntimeError):
    pass


def _fail_commit(monkeypatch):
    def boom(tmp, target):
        raise Injected(f"crash before renaming onto {target}")

    monkeypatch.setattr(atomic, "_commit", boom)


def test_resume_only_into_the_same_run(tmp_path: Path) -> None:
    """Trained on one target, rerun on another into the same directory: it must train again, not resume."""
    cfg = TrainConfig(checkpoint_dir=str(tmp_path), progress=False)
    a = make_taps(n_seqs=16, seed=0)
    first = make_attack("mlp", seed=0, **MLP).fit(a, trainer=cfg)
    assert first.fit_report["epochs_run"] == 3
    same = make_attack("mlp", seed=0, **MLP).fit(a, trainer=cfg)
    assert same.fit_report["train_seconds"] < first.fit_report["train_seconds"]  # resumed: nothing left to train
    b = make_taps(n_seqs=16, seed=0, table_seed=7)  # other data of the same shape and size
    other = make_attack("mlp", seed=0, **MLP).fit(b, trainer=cfg)
    assert other.fit_report["epochs_run"] == 3 and other.fit_report["history"] != first.fit_report["history"]
    for changed in (make_taps(n_seqs=16, seed=0, boundary="head:3"), make_taps(n_seqs=16, seed=0, sha="1" * 64)):
        again = make_attack("mlp", seed=0, **MLP).fit(changed, trainer=cfg)
        assert again.fit_report["history"] != other.fit_report["history"]
    more_dropout = make_attack("mlp", seed=0, **{**MLP, "dropout": 0.5})  # a hyper-parameter of the recipe
    assert more_dropout.fit(a, trainer=cfg).fit_report["history"] != first.fit_report["history"]


def test_save_refuses_to_overwrite_another_run(tmp_path: Path) -> None:
    out = tmp_path / "ckpt"
    make_attack("linear-probe", seed=0, **FAST).fit(make_taps(seed=0)).save(out)
    make_attack("linear-probe", seed=0, **FAST).fit(make_taps(seed=0)).save(out)  # the same run: fine
    other = make_attack("linear-probe", seed=0, **FAST).fit(make_taps(seed=0, table_seed=7))
    with pytest.raises(AttackError, match="different run; pass --force"):
        other.save(out)
    assert load_attack(out).meta["run"] != other.meta["run"]  # untouched
    other.save(out, force=True)
    assert load_attack(out).meta["run"] == other.meta["run"]


def test_failed_save_leaves_no_checkpoint_that_loads(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "ckpt"
    attack = make_attack("linear-probe", seed=0, **FAST).fit(make_taps(seed=0))
    attack.save(out)
    _fail_commit(monkeypatch)
    with pytest.raises(Injected):
        attack.save(out)
    with pytest.raises(AttackError, match="not an attack checkpoint"):
        load_attack(out)
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_failed_training_checkpoint_is_not_resumed(tmp_path: Path, monkeypatch) -> None:
    cfg = TrainConfig(checkpoint_dir=str(tmp_path), progress=False)
    taps = make_taps(seed=0)
    make_attack("mlp", seed=0, **MLP).fit(taps, trainer=cfg)
    ckpt = next(tmp_path.glob("*-train.json"))
    _fail_commit(monkeypatch)
    with pytest.raises(Injected):
        make_attack("mlp", seed=0, **{**MLP, "epochs": 4}).fit(taps, trainer=cfg)
    assert not ckpt.exists()  # the json (the completion marker) went first: nothing half-written resumes
    monkeypatch.undo()
    assert make_attack("mlp", seed=0, **MLP).fit(taps, trainer=cfg).fit_report["epochs_run"] == 3


# ---------------------------------------------------------------------------- tap stores
@pytest.fixture(scope="module")
def extracted(tiny, tmp_path_factory) -> Path:
    from attacks.taps import extract_taps

    tmp = tmp_path_factory.mktemp("taps")
    docs = tmp / "docs.jsonl"
    docs.write_text("\n".join(json.dumps({"doc_id": f"d{i}", "text": f"Document number {i} is short."})
                              for i in range(4)), encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPLITINFER_CACHE", str(tmp / "cache"))
        return extract_taps(tiny, f"file:{docs}", "head:2", progress=False).path


@pytest.fixture
def tapset(extracted: Path, tmp_path: Path) -> Path:
    """A private copy of a small extracted tap set, free to damage."""
    return Path(shutil.copytree(extracted, tmp_path / "taps"))


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "sub/shard.safetensors", "..", 7])
def test_index_entries_cannot_escape_the_store(tapset: Path, name) -> None:
    index = json.loads((tapset / INDEX_NAME).read_text())
    index["shards"][0]["file"] = name
    (tapset / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(AttackError, match="outside the tap directory"):
        TapSet(tapset)


def test_bad_shard_headers_are_one_line_errors(tapset: Path) -> None:
    shard = next(tapset.glob("shard-*.safetensors"))
    good = shard.read_bytes()
    hlen = int.from_bytes(good[:8], "little")
    header = json.loads(good[8 : 8 + hlen])
    cases = {
        "truncated": good[: len(good) - 10],
        "header a list": (2).to_bytes(8, "little") + b"[]",
        "offsets beyond the file": _with_header(header, "hidden", data_offsets=[0, 10**9]),
        "unknown dtype": _with_header(header, "hidden", dtype="F128"),
        "shape a string": _with_header(header, "hidden", shape="big"),
    }
    for what, data in cases.items():
        shard.write_bytes(data)
        with pytest.raises(AttackError, match="delete it and re-extract") as e:
            read_shard_header(shard)
        assert "\n" not in str(e.value), what
        with pytest.raises(AttackError):
            np.asarray(TapSet(tapset).hidden())


def _with_header(header: dict, name: str, **change) -> bytes:
    h = json.loads(json.dumps(header))
    h[name].update(change)
    raw = json.dumps(h).encode()
    return len(raw).to_bytes(8, "little") + raw


def test_failed_shard_write_leaves_no_shard(tmp_path: Path, monkeypatch) -> None:
    from attacks.tapstore import write_shard

    _fail_commit(monkeypatch)
    with pytest.raises(Injected):
        write_shard(tmp_path / "shard-00000.safetensors", {"hidden": np.zeros((4, 8), np.float16)})
    assert list(tmp_path.iterdir()) == []  # neither the shard nor its temporary file


def test_checkpoint_files_named_in_the_docs_exist(tmp_path: Path) -> None:
    out = make_attack("linear-probe", seed=0, **FAST).fit(make_taps(seed=0)).save(tmp_path / "c")
    assert {p.name for p in out.iterdir()} == {CONFIG_NAME, TENSORS_NAME}
