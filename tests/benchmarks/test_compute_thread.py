"""``python -m benchmarks.compute_thread``: one line of figures per case, each case in a fresh process."""

from __future__ import annotations

import json
import re

import pytest

from benchmarks import compute_thread


def test_prints_every_case(tiny_dir, capsys):
    assert compute_thread.main(["--model", str(tiny_dir), "--steps", "3", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    for case in compute_thread.CASES:
        assert re.search(rf"{case}: [\d.]+  [\d.]+\n", out), case


def test_one_case_prints_its_medians_as_json(tiny_dir, capsys):
    assert compute_thread.main(["--model", str(tiny_dir), "--steps", "2", "--repeats", "3",
                                "--case", "main"]) == 0  # a case that leaves this process's threads alone
    assert len(json.loads(capsys.readouterr().out.strip().splitlines()[-1])) == 3


def test_bad_counts_are_refused(tiny_dir):
    with pytest.raises(SystemExit):
        compute_thread.main(["--model", str(tiny_dir), "--steps", "0"])
