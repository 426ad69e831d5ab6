import pytest

from benchmarks import prompt_sets
from benchmarks.decoding_heldout import measured_at_rtt, run_heldout_bench
from benchmarks.decoding_report import format_report, summarize, targets
from splitinfer.client import SplitModel

PROMPTS = {"qa": [[{"role": "user", "content": "the cat sat on the mat. the cat sat on the"}],
                  [{"role": "user", "content": "a b c a b c a b"}]],
           "code": [[{"role": "user", "content": "def f(x):\n    return x\ndef g(x):\n    return"}]]}


@pytest.fixture(scope="module")
def results(tiny, tmp_path_factory):
    """One held-out run through the CLI on the tiny model (3 prompts, 10 tokens; rows '@5' stand in for '@128')."""
    import json

    from benchmarks import decoding_heldout
    from splitinfer.cli import main

    out = tmp_path_factory.mktemp("heldout")
    mp = pytest.MonkeyPatch()
    mp.setattr(prompt_sets, "prompt_set", lambda split, n=None: PROMPTS)
    mp.setattr(decoding_heldout, "SHORT", 5)
    try:
        assert main(["bench", "decoding", "--model", "tiny-random", "--prompt-split", "test2", "--max-new-tokens",
                     "10", "--out", str(out)]) == 0
    finally:
        mp.undo()
    yield SplitModel(tiny, "2,2", wire_dtype="fp32"), json.loads((out / "decoding.json").read_text()), out


def test_combined_outputs_are_greedy_and_every_source_is_replayed(results):
    _, res, out = results
    runs = res["runs"]
    assert {p.name for p in out.iterdir()} >= {"report.txt", "summary.json", "results.json", "decoding_tau.png"}
    assert len(runs["combined @5"]) == 3 and len(runs["prompt-lookup transformers-rule @5"]) == 3
    assert all(r["token_identical"] and r["argmax_mismatches"] == 0 for r in runs["combined"])
    real_seq = runs["sequential (real, 1/category)"]
    assert len(real_seq) == 2 and all(r["token_identical"] for r in real_seq)  # sequential == combined's tokens
    for name in ("sequential", "ngram-pool", "prompt-lookup", "suffix", "token-recycling", "rest",
                 "suffix-automaton", "combined +rest", "combined +suffix-automaton", "combined only rest"):
        assert len(runs[name]) == 3 and runs[name][0]["replayed"], name
    assert res["replay_checks"] == {"combined": True, "transformers prompt lookup rule": True}
    assert res["config"]["prompt_split"] == "test2" and res["config"]["categories"] == ["qa", "code"]
    assert "chat_template_sha256" in res["config"]["tokenisation"]
    assert res["measured_rtt"]["combined"]["identical"] == 2


def test_report_names_the_split_and_means_over_its_categories(results):
    _, res, _ = results
    table = summarize(res)
    assert table["combined"]["tau"]["mean"] == pytest.approx((table["combined"]["tau"]["qa"]
                                                              + table["combined"]["tau"]["code"]) / 2)
    text = format_report(res)
    assert "TEST2 split" in text and "nothing was tuned on it" in text
    retuned = format_report({**res, "config": {**res["config"], "prompt_split": "test"}})
    assert "TEST split" in retuned and "its figures have been read" in retuned  # test is no longer held out
    assert "measured speed-up of combined over sequential at 80 ms" in text
    assert "modelled speed-up over sequential at 80 ms, flat per-step compute, per category" in text
    t = targets(table, res)
    assert any("(code)" in k for k in t) and any("mean over categories" in k for k in t)


def test_measured_at_rtt_pays_the_round_trips(results, tiny):
    sm, _, _ = results
    from benchmarks.decoding import DecodingBench

    bench = DecodingBench(sm, PROMPTS, 6, 1e-4)
    bench.refs = [sm.generate(ids, 6) for ids in bench.ids]
    out = measured_at_rtt(bench, 40.0, 1, 6, {"step_ms": 50.0, "token_ms": 1.0})
    seq = out["sequential"]
    assert seq["n"] == 2 and seq["identical"] == 2
    assert seq["wall_s"] >= 0.04 * seq["steps"] * 0.9  # every step waited for the emulated RTT


def test_a_trained_drafter_is_run_alone_and_in_combined_and_checked(tmp_path, capsys):
    """``--proposers feature-draft`` on a held-out run adds the trained drafter alone and as a source of
    combined, run for real on every prompt and compared token by token with the greedy references."""
    import json

    from benchmarks import decoding_heldout
    from splitinfer.cli import main

    head, out = tmp_path / "head", tmp_path / "out"
    assert main(["draft-train", "--model", "tiny-random", "--out", str(head), "--tokens", "24", "--steps", "2",
                 "--batch", "8", "--hidden", "16", "--max-new-tokens", "8", "--prompt-chars", "30"]) == 0
    mp = pytest.MonkeyPatch()
    mp.setattr(prompt_sets, "prompt_set", lambda split, n=None: PROMPTS)
    mp.setattr(decoding_heldout, "SHORT", 5)
    try:
        assert main(["bench", "decoding", "--model", "tiny-random", "--prompt-split", "test", "--max-new-tokens",
                     "10", "--no-ablation", "--rtt-prompts", "0", "--proposers", "feature-draft", "--draft-head",
                     str(head), "--out", str(out)]) == 0
    finally:
        mp.undo()
    res = json.loads((out / "decoding.json").read_text())
    for label in ("feature-draft", "combined+feature-draft"):
        runs = res["runs"][label]
        assert len(runs) == 3 and all(r["token_identical"] and not r.get("replayed") for r in runs), label
    assert res["config"]["drafters"]["feature-draft"]["draft_head"] == str(head)
    assert res["config"]["draft_head_sha256"]
    goals = json.loads((out / "summary.json").read_text())["targets"]
    assert "combined+feature-draft: tau / ngram-pool tau (mean over categories)" in goals
    assert any(k.startswith("combined+feature-draft: tau / transformers") for k in goals)


def test_a_held_out_run_takes_only_model_drafters_as_proposers(tmp_path, capsys):
    from splitinfer.cli import main

    assert main(["bench", "decoding", "--model", "tiny-random", "--prompt-split", "test", "--proposers",
                 "jacobi", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "only adds model drafters" in err and "Traceback" not in err
