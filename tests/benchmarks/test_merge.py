"""Sharded suite runs: 2 shards merged give the metrics of 1 run; mismatched or incomplete shards are refused."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from benchmarks import checkout, schema
from benchmarks.merge import MERGERS, merge_dirs, merge_results
from benchmarks.run import run_suite
from benchmarks.shard import Shard
from benchmarks.stages import STAGES
from benchmarks.suite import load_suite
from splitinfer.errors import SplitInferError
from tests.notes_corpus import write_notes

SUITE = """name = "mini-shards"
model = "tiny-random"
seed = 0

[exactness]
splits = ["2,2"]
prompts = 1
tokens = 4
decodings = ["sequential"]

[attacks]
head_depths = [1, 2]
tail_depths = []
attacks = ["linear-probe", "vocab-match"]
corpora = ["file:CORPUS"]
train_tokens = 500
test_tokens = 160
max_length = 32
options = { "linear-probe" = { epochs = 1 }, "vocab-match" = { scored_tokens = 8, pii_tokens = 8 } }

[defenses]
head_depths = [2]
tail_layers = 1
defenses = ["none", "noise(sigma=0.5)", "quant(format=int8)", "random-split(depths=1,2)"]
attackers = ["linear-probe"]
corpora = ["file:CORPUS"]
train_tokens = 500
test_tokens = 160
max_length = 32
utility_positions = 40
greedy_prompts = 2
tokens = 4
options = { "linear-probe" = { epochs = 1 } }
overhead = ["quant(format=int8)"]
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("shards")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPLITINFER_CACHE", str(tmp / "cache"))
    corpus = tmp / "docs.jsonl"
    write_notes(corpus, 40)
    (tmp / "mini.toml").write_text(SUITE.replace("CORPUS", str(corpus)))
    suite = load_suite(str(tmp / "mini.toml"))
    out = {"whole": run_suite(suite, tmp / "whole")}
    for i in range(2):
        out[i] = run_suite(suite, tmp / f"shard-{i}", shard=Shard(i, 2))
    out["merged"] = merge_dirs(tmp / "merged", [tmp / "shard-1", tmp / "shard-0"])  # any order
    yield {k: v for k, v in out.items()} | {"tmp": tmp}
    mp.undo()


def _measured(doc: dict) -> dict:
    """Every metric except timings (info metrics in seconds, ms, tok/s: they differ run to run).

    bytes_per_step counts the reply headers, whose ``server_ms`` timing floats vary in length run to run.
    """
    timing = ("wall_s", "ms_per_step", "modelled_tok_s_80ms", "bytes_per_step")
    return {run: {k: v for k, v in ms.items() if k not in timing} for run, ms in doc["results"].items()
            if not run.startswith("harness/")}


def test_two_shards_merged_equal_one_run(runs: dict) -> None:
    whole, merged = schema.load(runs["whole"]), schema.load(runs["merged"])
    s0, s1 = schema.load(runs[0]), schema.load(runs[1])
    assert s0["shard"] == {"index": 0, "count": 2} and merged["merged_shards"] == 2 and "shard" not in merged
    # the shards split the grid: each ran part of it; only shard 0 ran the stage that is not shardable
    assert "exactness" in s0["data"] and "exactness" not in s1["data"]
    assert s1["data"]["attacks"]["rows"] and s1["data"]["defenses"]["rows"]
    assert {r["job"] for r in s0["data"]["defenses"]["rows"]} == {0, 2}
    a, b = _measured(merged), _measured(whole)
    diff = [(run, k, a.get(run, {}).get(k), b.get(run, {}).get(k)) for run in set(a) | set(b)
            for k in set(a.get(run, {})) | set(b.get(run, {})) if a.get(run, {}).get(k) != b.get(run, {}).get(k)]
    assert not diff, diff
    for stage, key in (("attacks", "rows"), ("defenses", "rows")):
        strip = lambda rows: [{k: v for k, v in r.items() if "seconds" not in k and k not in (  # noqa: E731
            "modelled_tok_s_80ms", "tok_s_80ms", "bytes_per_step", "attackers", "best", "info")} for r in rows]
        assert strip(merged["data"][stage][key]) == strip(whole["data"][stage][key]), stage
    assert merged["data"]["attacks"]["baselines"] == whole["data"]["attacks"]["baselines"]
    assert merged["data"]["defenses"]["random_split"] == whole["data"]["defenses"]["random_split"]
    names = lambda d: sorted(p.name for p in (d / "predictions").glob("*.jsonl.gz"))  # noqa: E731
    assert names(runs["merged"].parent) == names(runs["whole"].parent) != []
    assert "## Defenses" in (runs["merged"].parent / "report.md").read_text()


def test_every_shardable_stage_can_be_merged() -> None:
    assert {n for n, s in STAGES.items() if s.shardable} == set(MERGERS)


@pytest.mark.parametrize("text", ["1/1", "2/2", "-1/2", "a/b", "3", "0/0"])
def test_bad_shard_spec_is_one_line(text: str) -> None:
    with pytest.raises(SplitInferError, match=r"--shard .*give I/N with 0 <= I < N"):
        Shard.parse(text)


def test_mismatched_or_incomplete_shards_are_refused(runs: dict) -> None:
    docs = [(runs[i], schema.load(runs[i])) for i in range(2)]

    def changed(i: int, edit) -> list:
        out = copy.deepcopy(docs)
        edit(out[i][1])
        return out

    cases = [
        ([docs[0]], r"shard\(s\) 1/2 missing"),
        ([docs[0], docs[0]], "shard 0/2 given twice"),
        ([docs[0], (runs["whole"], schema.load(runs["whole"]))], "is not a shard"),
        (changed(1, lambda d: d.update(suite="other")), "suite 'other' differs"),
        (changed(1, lambda d: d.update(git_hash="0" * 40, code_digest="f" * 64)), "git_hash .* so does the code"),
        (changed(1, lambda d: (d.update(git_hash="0" * 40), d.pop("code_digest"))), "git_hash .* so does the code"),
        (changed(1, lambda d: d["config"].update(seed=1)), r"config\.seed differs"),
        (changed(1, lambda d: d["shard"].update(count=3)), "different counts"),
        ([], "at least one shard"),
        # a damaged shard entry or grid table is refused, never merged with its rows dropped or a shard invented
        (changed(1, lambda d: d["shard"].update(index=5)), r"0 <= I < N"),
        (changed(1, lambda d: d["shard"].update(index=-1)), r"0 <= I < N"),
        (changed(1, lambda d: d["shard"].update(index=0, count=0)), r"0 <= I < N"),
        (changed(1, lambda d: d.update(shard=3)), r"0 <= I < N"),
        (changed(1, lambda d: d["shard"].update(index="1")), r"0 <= I < N"),
        (changed(1, lambda d: d.pop("data")), "no 'data' table"),
        (changed(1, lambda d: d["data"]["defenses"].update(rows=["x"])), r"data\.defenses\.rows is not a list"),
    ]
    for given, message in cases:
        with pytest.raises(schema.SchemaError, match=message):
            merge_results(given)


def test_bench_merge_cli_reports_one_line(runs: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from splitinfer.cli import main

    assert main(["bench", "merge", str(tmp_path / "m"), str(runs[0].parent)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("splitinfer: error:") and "1/2 missing" in err and "\n" not in err
    assert main(["bench", "merge", str(tmp_path / "m"), str(runs[0].parent), str(runs[1].parent)]) == 0
    assert schema.load(tmp_path / "m" / "results.json")["merged_shards"] == 2


def test_a_merge_into_one_of_its_own_shards_is_refused(runs: dict) -> None:
    before = runs[0].read_bytes()
    with pytest.raises(schema.SchemaError, match="would overwrite it"):
        merge_dirs(runs[0].parent, [runs[0].parent, runs[1].parent])
    assert runs[0].read_bytes() == before


def test_a_partial_merge_needs_partial_and_shard_0_and_says_what_is_missing(runs: dict, tmp_path: Path) -> None:
    docs = [(runs[i], schema.load(runs[i])) for i in range(2)]
    merged = merge_results([docs[0]], partial=True)
    assert merged["merged_shards"] == 2 and merged["missing_shards"] == [1]
    assert merged["schema_minor"] >= 3 and set(merged["merged_by"]) == {"git_hash", "git_dirty"}
    assert {r["job"] for r in merged["data"]["defenses"]["rows"]} == {0, 2}  # shard 0's jobs only
    schema.validate(merged)
    with pytest.raises(schema.SchemaError, match=r"shard 0/2 missing: a partial merge needs shard 0"):
        merge_results([docs[1]], partial=True)
    assert "missing_shards" not in merge_results(docs, partial=True)  # a complete set is a complete merge
    path = merge_dirs(tmp_path / "partial", [runs[0].parent], partial=True)
    header = (path.parent / "report.md").read_text().split("\n## ")[0]
    assert "partial merge" in header and "shards 1 of 2 not run yet" in header


def test_shards_of_commits_that_differ_outside_the_code_merge(runs: dict) -> None:
    docs = [(runs[i], schema.load(runs[i])) for i in range(2)]
    docs[1][1]["git_hash"] = "0" * 40  # e.g. a commit that only added a report: the same code_digest
    merged = merge_results(docs)
    assert merged["git_hashes"] == sorted({"0" * 40, docs[0][1]["git_hash"]})
    assert "git_hashes" not in merge_results([(runs[i], schema.load(runs[i])) for i in range(2)])


def test_code_digest_follows_the_code_only(tmp_path: Path) -> None:
    for pkg in checkout.CODE_PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "m.py").write_text("x = 1\n")
    before = checkout.code_digest(tmp_path)
    (tmp_path / "README.md").write_text("docs\n")
    (tmp_path / "benchmarks" / "suite.toml").write_text("a = 1\n")
    assert checkout.code_digest(tmp_path) == before
    (tmp_path / "attacks" / "m.py").write_text("x = 2\n")
    assert checkout.code_digest(tmp_path) != before


def test_shards_of_one_commit_whose_code_differs_are_refused(runs: dict) -> None:
    """Same git_hash, different code_digest: a dirty tree whose code changed between the shards (the digest is
    what the code was), not one run."""
    docs = [(runs[i], schema.load(runs[i])) for i in range(2)]
    docs[1][1]["code_digest"] = "f" * 64
    with pytest.raises(schema.SchemaError, match=r"code_digest .* differs"):
        merge_results(docs)
    docs[1][1].pop("code_digest")  # a shard without a digest (older code): the commit alone decides, as before
    assert merge_results(docs)["merged_shards"] == 2


def test_a_merge_of_older_shards_declares_the_minor_of_the_keys_it_adds(runs: dict) -> None:
    """merged_by (minor 3) is written by every merge: shards written at minor 2 merge into a minor-3 document."""
    docs = [(runs[i], schema.load(runs[i])) for i in range(2)]
    for _, d in docs:
        d["schema_minor"] = 2
        d.pop("code_digest")
    merged = merge_results(docs)
    assert "merged_by" in merged and merged["schema_minor"] == schema.SCHEMA_MINOR
