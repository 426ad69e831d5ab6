"""benchmarks.defenses_answers on hand-made rows: each answer follows from the rows it prints."""

from benchmarks.defenses_answers import answer_a, answer_b


def _split(depths: list[int], hits: int, sessions: int) -> dict:
    return {"defense": f"random-split(depths={','.join(map(str, depths))})", "threat_model": "t",
            "sequence_acc": hits / sessions, "sequences": sessions, "token_acc": hits / sessions,
            "chance": 1 / len(depths)}


def test_depth_identification_over_two_depths_can_be_a_yes() -> None:
    """Two depths: chance is 50%, so 'more than twice chance' could never be met, even at 20 of 20 sessions."""
    assert answer_b([_split([1, 4], 20, 20)]).startswith("`random-split(depths=1,4)` (t): yes")


def test_depth_identification_yes_needs_more_than_chance_with_its_interval() -> None:
    assert ": yes" in answer_b([_split([2, 4, 8], 20, 20)])
    assert "not reliably" in answer_b([_split([2, 4, 8], 8, 20)])  # 40% [19, 64]: chance 33% inside
    assert "not reliably" in answer_b([_split([1, 4], 3, 4)])  # 75% of 4 sessions [19, 99]
    assert "95% CI [83.2, 100.0]" in answer_b([_split([2, 4, 8], 20, 20)])


def _row(family: str, value: float, lo: float, hi: float, depth: int = 2) -> dict:
    return {"family": family, "depth": depth, "defense": family, "next_token_agreement": 0.9,
            "best": {"attack": "vocab-match-adaptive", "threat_model": "t",
                     "top1": {"value": value, "ci_low": lo, "ci_high": hi}}}


def test_a_drop_inside_the_intervals_is_not_called_a_drop() -> None:
    """The quick report said 'yes, partly: falls by up to 12.5 points' on 87.5% [75, 100] against 100% [79, 100]."""
    none = _row("none", 1.0, 0.794, 1.0)
    assert answer_a([none, _row("lora-random", 0.875, 0.75, 1.0)]).startswith("not shown: recovery falls by up to 12.5")
    assert answer_a([none, _row("lora-random", 0.60, 0.50, 0.70)]).startswith("yes, partly: recovery falls by up to "
                                                                             "40.0 points (significant")
    assert answer_a([none, _row("lora-random", 0.98, 0.95, 1.0)]).startswith("no: recovery falls by at most 2.0")


def test_a_drop_is_judged_by_the_paired_difference_where_the_rows_have_it() -> None:
    """Overlapping intervals, but the paired bootstrap over the same documents excludes 0: a drop (issue 28)."""
    none = _row("none", 1.0, 0.794, 1.0)
    row = {**_row("lora-random", 0.875, 0.75, 1.0), "vs_undefended": {"value": -0.125, "ci_low": -0.2, "ci_high": -0.05}}
    assert answer_a([none, row]).startswith("yes, partly: recovery falls by up to 12.5 points (significant")
    row["vs_undefended"] = {"value": -0.125, "ci_low": -0.3, "ci_high": 0.02}
    assert answer_a([none, row]).startswith("not shown")
