"""``bench decoding`` end to end on the tiny model: what the results record, and bit-exact logits with
batch-invariant kernels (the 20-prompt run on the default model is ``splitinfer bench decoding``)."""

from __future__ import annotations

import hashlib

import pytest

from benchmarks.decoding import run_decoding_bench
from benchmarks.decoding_report import format_report, summarize, targets
from splitinfer.client import SplitModel
from splitinfer.decoding.feature_head import head_files
from splitinfer.models import load_model


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_a_small_run_records_its_kernels_head_and_options(feature_head_dir, batch_invariant):
    loaded = load_model("tiny-random", batch_invariant=batch_invariant)
    sm = SplitModel(loaded, "2,2", wire_dtype="fp32")
    results = run_decoding_bench(sm, max_new_tokens=12, prompts_per_category=1, ablation=False,
                                 proposers=["sequential", "ngram-pool", "combined", "feature-draft"],
                                 draft_head=str(feature_head_dir), feature_draft_options={"shortlist": False})
    cfg = results["config"]
    assert cfg["kernels"] == ("batch-invariant" if batch_invariant else "default") and cfg["device"] == "cpu"
    assert cfg["draft_head_sha256"] == hashlib.sha256(head_files(feature_head_dir)[0].read_bytes()).hexdigest()
    assert cfg["feature_draft_options"] == {"shortlist": False}
    runs = results["runs"]
    assert {"feature-draft", "combined+feature-draft", "combined", "ngram-pool"} <= set(runs)
    assert all(r["token_identical"] for recs in runs.values() for r in recs)
    if batch_invariant:  # bit for bit: every proposer, and the unsplit model in 16-token forwards
        assert all(r["max_logit_diff"] == 0.0 for recs in runs.values() for r in recs if not r.get("replayed"))
        assert results["noise_floor"]["max"] == 0.0
    results["targets"] = targets(summarize(results), results)
    report = format_report(results)
    assert f"{cfg['kernels']} kernels" in report and "fitted CPU costs" in report


def test_peers_and_token_recycling_replay_in_a_small_run():
    sm = SplitModel(load_model("tiny-random"), "2,2", wire_dtype="fp32")
    results = run_decoding_bench(sm, max_new_tokens=16, prompts_per_category=1, ablation=True, ablation_prompts=0,
                                 proposers=["sequential", "ngram-pool", "token-recycling", "combined"])
    peer = results["peers"]["transformers prompt-lookup k=10 (unsplit)"]
    assert len(peer) == 4 and all(r["forwards"] >= 1 and r["tau"] == r["tokens"] / r["forwards"] for r in peer)
    assert results["peers"]["assisted generation"].startswith("n/a")
    assert results["replay_checks"]["token-recycling"] is True  # committed-only learning replays exactly
    assert "token-recycling k=2 T=8" in results["runs"]
    assert results["replay_checks"]["transformers prompt lookup rule"] is True  # our replay = its real runs
    results["targets"] = targets(summarize(results), results)
    assert any("transformers prompt-lookup" in k for k in results["targets"])
    assert "peers on the unsplit model" in format_report(results)


def test_humaneval_and_subset_runs_replay_the_rest(monkeypatch, tmp_path):
    """Replayable proposers run for real on a subset only, are replayed on every prompt (checked against the
    subset), HumanEval is its own category outside the mean, and the per-source ablation is in the report."""
    import benchmarks.decoding as dec

    monkeypatch.setattr(dec, "humaneval_prompts", lambda n: [f"def f{i}(x):\n    return x + {i}" for i in range(n)])
    sm = SplitModel(load_model("tiny-random"), "2,2", wire_dtype="fp32")
    results = run_decoding_bench(sm, max_new_tokens=10, prompts_per_category=2, ablation=True, humaneval=2,
                                 subset_prompts=1, peers=False, refs_out=tmp_path / "refs.pt",
                                 proposers=["sequential", "suffix", "token-recycling", "combined"])
    runs = results["runs"]
    assert len(runs["sequential"]) == len(runs["combined"]) == 10 and not runs["combined"][0].get("replayed")
    assert len(runs["suffix (real, 1/category)"]) == 5 and all(r["replayed"] for r in runs["suffix"])
    assert len(runs["suffix"]) == 10 and results["replay_checks"]["suffix"] is True
    assert results["replay_checks"]["token-recycling"] is True and "ngram-pool" not in runs
    table = summarize(results)
    row = table["combined"]["tau"]
    assert "humaneval" in row and row["mean"] == pytest.approx(sum(row[c] for c in ("code", "structured",
                                                                                      "creative", "conversational")) / 4)
    assert {"combined -suffix", "combined only token-recycling", "token-recycling static d6 (paper-like)"} <= set(runs)
    results["targets"] = targets(table, results)
    report = format_report(results)
    assert "per-source ablation" in report and "humaneval" in report
    import torch

    from benchmarks.decoding_tune import replay_config, table_row

    from benchmarks.refs_file import load_refs

    refs = load_refs(tmp_path / "refs.pt")  # decoding_tune's replays reproduce the bench's (no pickle: issue 30)
    assert len(refs["refs"]) == 10 and len(refs["refs"][0]["output"]) == runs["sequential"][0]["tokens"]
    per = replay_config(refs, "suffix", {}, {"code"})  # the code prompts come first: the same suffix history
    assert per["code"] == [(r["tokens"], len(r["steps"])) for r in runs["suffix"][:2]]
    assert table_row(per, ["code"])["code"] == summarize(results)["suffix"]["tau"]["code"]  # pooled the same way
    from splitinfer.timing import StepTimeModel

    model = StepTimeModel.from_dict(results["step_model"]).project(80.0, 100.0)  # decoding_tune --step-model
    timed = replay_config(refs, "suffix", {}, {"code"}, step_model=model)
    assert [p[:2] for p in timed["code"]] == per["code"]  # the same replay, with each prompt's modelled ms
    row = table_row(timed, ["code"])
    assert row["tok_s_cpu80"] == pytest.approx(1e3 * sum(p[0] for p in timed["code"]) / sum(p[2] for p in timed["code"]))
    assert row["tok_s_flat80"] >= row["tok_s_cpu80"] > 0  # flat compute never costs more than T positions' compute


def test_decoding_tune_names_a_step_model_file_without_fitted_costs(tmp_path):
    from benchmarks.decoding_tune import load_step_model

    bad = tmp_path / "summary.json"
    bad.write_text('{"config": {}}')
    with pytest.raises(SystemExit, match="no fitted step costs"):
        load_step_model(bad)


def test_decoding_tune_builds_references_over_the_tuning_splits_and_refuses_test2(monkeypatch, capsys):
    from benchmarks import decoding_tune, prompt_sets
    from splitinfer.client import SplitModel
    from splitinfer.models import load_model

    with pytest.raises(SystemExit):  # argparse's one-line error, before any model loads
        decoding_tune.main(["--refs", "unused.pt", "--prompt-split", "dev,test2"])
    assert "test2 is held out" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        decoding_tune.main(["--refs", "unused.pt", "--prompt-split", "train"])
    assert "unknown split train" in capsys.readouterr().err
    assert decoding_tune._splits("dev, test") == "dev,test"
    msgs = {"dev": [[{"role": "user", "content": "Say hi."}]], "test": [[{"role": "user", "content": "Count to 3."}]]}
    monkeypatch.setattr(prompt_sets, "prompt_set", lambda split, n=None: {"qa": msgs[split]})
    sm = SplitModel(load_model("tiny-random"), "2,2", wire_dtype="fp32")
    refs = decoding_tune.build_refs(sm, 0, 4, prompt_split="dev,test")
    assert [r["category"] for r in refs["refs"]] == ["qa", "qa"]  # one category pools both splits' prompts
    assert refs["refs"][0]["ids"] != refs["refs"][1]["ids"] and all(r["output"] for r in refs["refs"])
