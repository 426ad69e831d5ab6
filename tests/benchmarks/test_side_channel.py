"""benchmarks.side_channel on the tiny model: the cloud's view matches the run, and the report and results."""

from pathlib import Path

import pytest

from attacks.side_channel import session_features
from benchmarks.side_channel import FIXED_COSTS, CloudView, main, run_task, task_sessions
from benchmarks.schema import load
from splitinfer.client import SplitModel

PROMPT = "the cat sat on the mat and the cat sat on the mat and the cat"


def test_the_clouds_frames_give_each_steps_commits(tiny):
    sm = SplitModel(tiny, "2,1")
    view = CloudView(sm.link.service)
    view.take()
    res = sm.generate(PROMPT, 48, decoding="combined", decoding_options=FIXED_COSTS)  # tree sizes: not timing
    frames = view.take()
    assert len(frames) == len(res.steps) and len(frames[0]["positions"]) == len(sm.encode_prompt(PROMPT))
    assert [len(f["positions"]) for f in frames] == [s.tokens_sent for s in res.steps]
    starts = [min(f["positions"]) for f in frames[1:]]
    assert [b - a for a, b in zip(starts, starts[1:])] == [s.tokens_committed for s in res.steps[1:-1]]
    f = session_features(frames)
    assert f["advance_max"] >= 2  # drafts went through (measured: 2 tokens in several steps): the cloud sees it


def test_copy_task_pairs_each_paragraph_with_both_instructions():
    sessions = task_sessions("copy-vs-summarise", 3)
    assert [y for _, y, _ in sessions] == [1, 1, 1, 0, 0, 0]
    assert [g for *_, g in sessions[:3]] == [g for *_, g in sessions[3:]]  # a paragraph's two prompts: one group
    assert sessions[0][0].split("\n\n", 1)[1] == sessions[3][0].split("\n\n", 1)[1]
    with pytest.raises(ValueError, match="unknown task"):
        task_sessions("mood", 3)


def test_run_writes_results_and_report(tiny, tmp_path: Path, monkeypatch):
    import benchmarks.side_channel as sc
    from splitinfer import models

    monkeypatch.setattr(models, "load_model", lambda spec: tiny)
    rc = main(["--model", "tiny-random", "--split", "2,1", "--per-class", "5", "--tokens", "6",
               "--tasks", "copy-vs-summarise", "--out", str(tmp_path)])
    assert rc == 0
    doc = load(tmp_path / "results.json")
    assert {"side_channel/copy-vs-summarise/combined/lengths", "side_channel/copy-vs-summarise/combined/speculation",
            "side_channel/copy-vs-summarise/combined/all"} <= set(doc["results"])
    text = (tmp_path / "report.md").read_text()
    assert "| copy-vs-summarise | speculation |" in text and "majority baseline" in text
    row = run_task(tiny, "copy-vs-summarise", 3, 4, "sequential", "2,1", 0)
    assert all(f["advance_max"] == 1 for f in row["features"])  # sequential commits one token per round trip
    assert sc.TASKS == ("code-vs-chat", "copy-vs-summarise")
