"""The checkout a result comes from: its commit and dirty flag, as a command found it."""

from __future__ import annotations

import subprocess

from benchmarks import checkout, schema


def _one_commit_repo(path) -> None:
    """A git repository at ``path`` with one committed file, ``a.txt``."""
    def git(*args):
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)

    git("init", "-q")
    (path / "a.txt").write_text("a")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")


def test_git_hash_and_dirty_flag(tmp_path):
    _one_commit_repo(tmp_path)
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    res = schema.new_results({}, "ci", repo_dir=tmp_path)
    assert res["git_hash"] == head and res["git_dirty"] is False
    (tmp_path / "a.txt").write_text("b")
    assert schema.new_results({}, "ci", repo_dir=tmp_path)["git_dirty"] is True


def test_a_run_is_recorded_as_the_checkout_was_when_it_started(tmp_path):
    _one_commit_repo(tmp_path)
    checkout.remember_git_state(tmp_path)  # what the CLI does when a command starts
    try:
        (tmp_path / "reports").mkdir()
        (tmp_path / "reports" / "plot.png").write_bytes(b"the run's own output")  # untracked, written by the run
        assert schema.new_results({}, "ci", repo_dir=tmp_path)["git_dirty"] is False  # was True
        assert checkout.git_state(tmp_path)[1] is False  # every caller of git_state, not results documents only
    finally:
        checkout.forget_git_state()
    assert schema.new_results({}, "ci", repo_dir=tmp_path)["git_dirty"] is True  # read live again


def test_the_cli_records_a_bench_document_as_the_checkout_was_at_its_start(tmp_path, monkeypatch):
    from splitinfer import cli

    seen = {}

    def fake_bench(args):  # a command that writes its output into the tree, then makes its document
        seen["doc"] = schema.new_results({}, "ci")
        return 0

    started = checkout.git_state()
    monkeypatch.setattr(cli, "build_parser", lambda: _parser_running(fake_bench))
    assert cli.main([]) == 0
    assert (seen["doc"]["git_hash"], seen["doc"]["git_dirty"]) == started
    assert not checkout._AT_START  # forgotten when the command ends


def _parser_running(func):
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--verbose", action="store_true")
    parser.set_defaults(func=func)
    return parser
