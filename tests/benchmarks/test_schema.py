"""Tests of the versioned results JSON (benchmarks.schema)."""

from __future__ import annotations

import copy
import json
from datetime import datetime

import numpy as np
import pytest

from benchmarks import schema
from benchmarks.schema import SchemaError

CONFIG = {
    "model": {"id": "tiny-random", "sha256": "ab" * 32},
    "corpora": {"prose": {"sha256": "cd" * 32, "n_docs": 10}},
    "split": {"train": 0.8, "val": 0.1, "test": 0.1},
    "seeds": [0],
}


def make_results(tmp_path=None):
    res = schema.new_results(copy.deepcopy(CONFIG), "ci", repo_dir=tmp_path)
    schema.add_metric(
        res, "linear-probe/head:2", "token_acc_top1", schema.metric(0.8, 0.75, 0.85, n=400, kind="accuracy")
    )
    schema.add_metric(res, "sequential/rtt:20", "token_identity", schema.metric(True, kind="exact"))
    schema.add_metric(res, "sequential/rtt:20", "efficiency", schema.metric(0.9, kind="efficiency"))
    schema.add_metric(res, "sequential/rtt:20", "tok_s", schema.metric(12.5, kind="info", unit="tok/s"))
    return res


def test_new_results_fills_the_header(tmp_path):
    res = schema.new_results(CONFIG, "quick", repo_dir=tmp_path)  # tmp_path is not a git repo
    assert res["schema_version"] == schema.SCHEMA_VERSION == 1
    assert res["suite"] == "quick" and res["config"] == {**CONFIG, "plugins": []} and res["results"] == {}
    assert res["git_hash"] == "unknown" and res["git_dirty"] is None
    assert set(res["versions"]) >= {"python", "torch", "transformers", "numpy", "splitinfer"}
    assert res["versions"]["numpy"] == np.__version__
    # the instruction set torch's CPU kernels used: float results can differ in their last bits across it
    import torch

    assert res["versions"]["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert datetime.fromisoformat(res["date"]).utcoffset().total_seconds() == 0
    schema.validate(res)


def test_round_trip_save_load(tmp_path):
    res = make_results(tmp_path)
    path = schema.save(res, tmp_path / "out" / "results.json")
    assert schema.load(path) == res
    text = path.read_text()
    assert text.endswith("\n")
    assert text == json.dumps(res, sort_keys=True, indent=2) + "\n"


def test_metric_converts_numpy_scalars_and_stays_serialisable():
    m = schema.metric(np.float64(0.5), np.float32(0.25), np.float64(0.75), n=np.int64(10), kind="accuracy")
    assert type(m["n"]) is int and type(m["ci_low"]) is float
    json.dumps(m)
    res = make_results()
    schema.add_metric(res, "r", "m", {**m, "value": np.float32(0.5)})
    assert type(res["results"]["r"]["m"]["value"]) is float


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"value": "x", "kind": "accuracy"}, r"metric\.value is not a number"),
        ({"value": float("nan"), "kind": "efficiency"}, r"metric\.value is not a number"),
        ({"value": 0.5, "kind": "speed"}, r"metric\.kind is 'speed'"),
        ({"value": 0.5, "ci_low": 0.1, "kind": "accuracy"}, "must both be numbers or both null"),
        ({"value": 0.5, "ci_low": 0.9, "ci_high": 0.1, "kind": "accuracy"}, "greater than ci_high"),
        ({"value": 0.5, "n": -1, "kind": "accuracy"}, r"metric\.n is not a non-negative integer"),
        ({"value": 0.5, "higher_is_better": 1, "kind": "accuracy"}, "higher_is_better is not a bool"),
        ({"value": [1], "kind": "exact"}, "finite number, bool or string"),
    ],
)
def test_metric_rejects_bad_entries(kwargs, match):
    with pytest.raises(SchemaError, match=match):
        schema.metric(**kwargs)


def test_metric_requires_kind():
    with pytest.raises(TypeError):
        schema.metric(0.5)  # type: ignore[call-arg]


def test_add_metric_refuses_duplicates_unless_replace():
    res = make_results()
    m = schema.metric(0.1, kind="info")
    with pytest.raises(SchemaError, match=r"results\['linear-probe/head:2'\]\['token_acc_top1'\] already exists"):
        schema.add_metric(res, "linear-probe/head:2", "token_acc_top1", m)
    schema.add_metric(res, "linear-probe/head:2", "token_acc_top1", m, replace=True)
    assert res["results"]["linear-probe/head:2"]["token_acc_top1"] == m
    with pytest.raises(SchemaError, match="run must be a non-empty string"):
        schema.add_metric(res, "", "x", m)


def _set(doc, path, value):
    *head, last = path
    for key in head:
        doc = doc[key]
    if value is KeyError:
        del doc[last]
    else:
        doc[last] = value


@pytest.mark.parametrize(
    "path, value, message",
    [
        (
            ("results", "linear-probe/head:2", "token_acc_top1", "ci_low"),
            "low",
            "results['linear-probe/head:2']['token_acc_top1'].ci_low is not a number",
        ),
        (
            ("results", "linear-probe/head:2", "token_acc_top1", "n"),
            KeyError,
            "results['linear-probe/head:2']['token_acc_top1'].n is missing",
        ),
        (
            ("results", "sequential/rtt:20", "efficiency", "extra"),
            1,
            "results['sequential/rtt:20']['efficiency'] has unknown key(s) ['extra']",
        ),
        (("results", "sequential/rtt:20"), [], "results['sequential/rtt:20'] is not an object"),
        (("schema_version",), 2, "schema_version is 2, this code reads 1 (written by a newer splitinfer"),
        (("git_hash",), KeyError, "git_hash is missing"),
        (("git_dirty",), "yes", "git_dirty is not a bool or null"),
        (("config",), "cfg", "config is not an object"),
        (("versions", "torch"), 2.4, "versions['torch'] is not a string or null"),
        (("date",), "yesterday", "date is not an ISO 8601 timestamp"),
        (("results",), [], "results is not an object"),
        (("config", "plugins"), ["x"], "config.plugins is not a list of {name, digest, version} objects"),
        (("config", "plugins"), [{"digest": "a"}], "config.plugins is not a list"),
        (("config", "plugins"), "abc", "config.plugins is not a list"),
        (("shard",), 3, "shard is not an object"),
    ],
)
def test_validate_names_the_bad_path(path, value, message):
    res = make_results()
    schema.validate(res)
    _set(res, path, value)
    with pytest.raises(SchemaError) as info:
        schema.validate(res)
    assert message in str(info.value)


def test_validate_allows_extra_top_level_keys():
    res = make_results()
    res["notes"] = "anything"
    schema.validate(res)


def test_load_errors_are_clear(tmp_path):
    with pytest.raises(SchemaError, match="no such results file"):
        schema.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1,\n  oops}')
    with pytest.raises(SchemaError, match=r"bad\.json: not valid JSON \(line 2, column 3"):
        schema.load(bad)
    invalid = tmp_path / "invalid.json"
    res = make_results()
    res["results"]["linear-probe/head:2"]["token_acc_top1"]["value"] = None
    invalid.write_text(json.dumps(res))
    with pytest.raises(SchemaError, match=r"invalid\.json: results\['linear-probe/head:2'\]\['token_acc_top1'\]"):
        schema.load(invalid)


def test_save_refuses_invalid_and_leaves_no_file(tmp_path):
    res = make_results()
    res["results"]["r"] = {"m": {"value": 1}}
    with pytest.raises(SchemaError):
        schema.save(res, tmp_path / "r.json")
    assert list(tmp_path.iterdir()) == []


def test_summarize_output_is_a_valid_metric():
    from attacks.metrics import summarize

    res = make_results()
    out = summarize([[1, 2, 3]], [[[1, 0, 0, 0, 0], [2, 0, 0, 0, 0], [0, 0, 3, 0, 0]]], vocab_size=50, n_boot=20)
    for name, entry in out.items():
        schema.add_metric(res, "linear-probe/head:1", name, entry)
    schema.validate(res)


def test_a_document_of_another_version_is_named_as_such_before_its_keys_are_checked():
    with pytest.raises(SchemaError, match="schema_version is 2, this code reads 1"):
        schema.validate({"schema_version": 2})
