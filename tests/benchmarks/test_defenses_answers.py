"""benchmarks.defenses_answers on hand-made rows: each answer follows from the rows it prints."""

from benchmarks.defenses_answers import answer_a, answer_b, answer_c, answer_d, answer_g, scan_cap


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


def _utility_row(family: str, rec: tuple[float, float, float], agr: tuple[float, float, float], depth: int = 2,
                 name: str | None = None) -> dict:
    """A row with recovery (point, low, high) and next-token agreement (point, low, high)."""
    row = _row(family, *rec, depth=depth)
    row["defense"] = name or family
    row["next_token_agreement"] = agr[0]
    row["intervals"] = {"next_token_agreement": {"value": agr[0], "ci_low": agr[1], "ci_high": agr[2]}}
    row["modelled_tok_s_80ms"], row["bytes_per_step"] = 8.5, 2672.6
    return row


def test_noise_is_only_in_the_middle_when_both_intervals_are() -> None:
    """The points (8% recovery, 95% agreement) are in, but recovery's interval reaches 12%: not a yes."""
    crossing = _utility_row("noise", (0.08, 0.05, 0.12), (0.95, 0.92, 0.97))
    assert answer_d([crossing]).startswith("not shown: the points of head 2 `noise` are in")
    clear = _utility_row("noise", (0.04, 0.02, 0.07), (0.95, 0.92, 0.97))
    assert answer_d([clear]).startswith("yes: head 2 `noise`")
    line = "next-token agreement 95.0% [92.0, 97.0], 8.50 tok/s at 80 ms (modelled), 2,673 bytes/step"
    assert line in answer_d([clear])


def test_the_empty_middle_is_asked_of_every_configuration_per_depth() -> None:
    rows = [_row("none", 1.0, 0.9, 1.0),
            _utility_row("pclip", (0.99, 0.95, 1.0), (0.96, 0.94, 0.97), name="clip only"),
            _utility_row("pclip", (0.60, 0.55, 0.65), (0.93, 0.91, 0.95), name="clip + a little noise"),
            _utility_row("noise", (0.05, 0.02, 0.08), (0.12, 0.10, 0.14), name="loud noise"),
            _utility_row("quant", (0.04, 0.01, 0.06), (0.95, 0.93, 0.97), depth=8, name="int2")]
    text = answer_g(rows)
    assert text.startswith("head 2: no (3 configurations); least recovered with agreement above 90%: head 2, "
                           "`clip + a little noise`: recovery 60.0% [55.0, 65.0]")
    assert "best agreement with recovery under 10%: head 2, `loud noise`" in text
    assert "head 8: yes, head 8, `int2`" in text
    assert answer_g([rows[0]]) == "not measured in this suite"


def test_a_row_without_a_decode_step_is_never_quoted_at_zero_tok_s() -> None:
    """Full grid job 6 (noise 0.02 x C, head 2) stored 0.0 tok/s: its `combined` runs stopped at the first token;
    answer (d) quoted "0.00 tok/s at 80 ms (modelled)"."""
    for stored in (0.0, None):
        row = _utility_row("noise", (0.92, 0.91, 0.93), (0.41, 0.38, 0.43))
        row["modelled_tok_s_80ms"] = stored
        text = answer_d([row])
        assert "0.00 tok/s" not in text
        assert "no tok/s at 80 ms (every `combined` generation stopped at its first token)" in text


def _quant_rows(cap_key: dict) -> list[dict]:
    none = _row("none", 0.999, 0.962, 1.0, depth=8)
    int8 = {**_row("quant", 0.945, 0.921, 0.966, depth=8), "defense": "quant(format=int8)",
            "strength": {"quant": {"format": "int8"}}}
    int8["best"].update(cap_key)
    int8["vs_undefended"] = {"value": -0.054, "ci_low": -0.08, "ci_high": -0.03}
    return [none, int8]


def test_a_drop_behind_a_capped_scan_is_called_the_attackers_bound() -> None:
    """Full grid job 15 (int8, head 8): 94.5% against 99.9% undefended read as 'yes, partly: falls by up to 5.4
    points', but its matcher scanned only the proposer's first 256 candidates where int8 states match exactly
    (100% on the same code tokens without the cap)."""
    legacy = {"vocab-match-adaptive": {"max_candidates": 256}}  # rows of older runs record no cap of their own
    for rows, options in ((_quant_rows({}), legacy), (_quant_rows({"candidate_cap": 256}), None)):
        text = answer_c(rows, options)
        assert "head 8 `quant(format=int8)` (at most 256 per position)" in text
        assert "a bound set by the attacker" in text
    for rows, options in ((_quant_rows({"candidate_cap": None}), legacy), (_quant_rows({}), None)):
        assert "bound set by the attacker" not in answer_c(rows, options)


def test_the_scan_cap_is_the_rows_own_before_the_runs_options() -> None:
    opts = {"vocab-match-adaptive": {"max_candidates": 256}, "mlp": {"epochs": 8}}
    assert scan_cap({"attack": "vocab-match-adaptive", "candidate_cap": None}, opts) is None
    assert scan_cap({"attack": "vocab-match-adaptive"}, opts) == 256
    assert scan_cap({"attack": "mlp"}, opts) is None
    assert scan_cap({"attack": "vocab-match-adaptive"}, {"vocab-match-adaptive": {"max_candidates": "auto"}}) is None
