"""benchmarks.defenses_tables: the utility table's speed column and the denoiser's paired gain."""

from benchmarks.defenses_tables import utility_table


def _row(tok_s) -> dict:
    iv = {"value": 0.5, "ci_low": 0.4, "ci_high": 0.6, "n": 100}
    return {"depth": 2, "defense": "noise(sigma=0.02,clip=66.55)", "perplexity_undefended": 37.68,
            "bytes_per_step": 2672.6, "tau_combined": 1.0, "modelled_tok_s_80ms": tok_s,
            "intervals": {k: iv for k in ("next_token_agreement", "perplexity", "greedy_identity",
                                          "answer_token_f1", "answer_perplexity")}}


def test_no_decode_step_is_shown_as_not_available_never_zero() -> None:
    for stored in (None, 0.0):  # written from now on / stored by the grid run before
        line = utility_table([_row(stored)])[-1]
        assert line.endswith("| n/a (no decode step) |") and "0.00 |" not in line
    assert utility_table([_row(8.4)])[-1].endswith("| 1.00 | 8.40 |")


def test_the_utility_table_states_the_denoisers_paired_gain_under_it() -> None:
    base, den = _row(8.4), _row(8.4)
    den["defense"] = base["defense"] + "+denoise(mode=learned,profile=cd)"
    base["utility_by_sequence"] = {"agreed": [3, 4, 2, 5], "positions": [10] * 4}
    den["utility_by_sequence"] = {"agreed": [5, 6, 4, 7], "positions": [10] * 4}
    lines = utility_table([base, den])
    assert lines[-1] == (f"- head 2, `{den['defense']}` against `{base['defense']}`: +20.0 [+20.0, +20.0] * "
                         "(4 sequences)")
    assert not any("wins back" in line for line in utility_table([_row(8.4)]))
