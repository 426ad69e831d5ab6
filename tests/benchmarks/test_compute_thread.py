"""``python -m benchmarks.compute_thread``: prints a main-thread and a worker-thread figure per repeat."""

from __future__ import annotations

import re

import pytest

from benchmarks import compute_thread


def test_prints_both_threads_and_their_ratio(tiny_dir, capsys):
    assert compute_thread.main(["--model", str(tiny_dir), "--steps", "3", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"main thread: [\d.]+  [\d.]+\n", out) and re.search(r"worker thread: [\d.]+  [\d.]+\n", out)
    assert re.search(r"worker / main \(medians over repeats\): [\d.]+x", out)


def test_bad_counts_are_refused(tiny_dir):
    with pytest.raises(SystemExit):
        compute_thread.main(["--model", str(tiny_dir), "--steps", "0"])
