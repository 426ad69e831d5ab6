"""defense_utility: teacher-forced agreement, perplexity and answer NLL on the model's own device."""

import math

import pytest
import torch

from benchmarks.defense_utility import _answer_nll, clean_logits, denoiser_gains, teacher_forced
from splitinfer.client import SplitModel
from tests.devices import DEVICES, on_device


@pytest.mark.parametrize("device", DEVICES)
def test_undefended_split_agrees_with_the_model_and_answer_nll_is_the_models(tiny, device):
    loaded = on_device(tiny, device)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 250, (12,), generator=g).tolist() for _ in range(3)]
    cache: dict = {}
    got = teacher_forced(loaded, SplitModel(loaded, "2,2"), seqs, cache, n_boot=50)
    assert got["next_token_agreement"]["value"] == 1.0 and got["positions"] == 33
    assert got["by_sequence"] == {"agreed": [11, 11, 11], "positions": [11, 11, 11]}
    assert got["perplexity"]["value"] == pytest.approx(got["perplexity_undefended"]["value"], rel=1e-4)
    assert all(t.device.type == device for t in clean_logits(loaded, seqs, cache))
    prompt, answer = seqs[0][:5], seqs[0][5:]
    with torch.no_grad():
        logp = torch.log_softmax(tiny.model(torch.tensor([seqs[0]])).logits[0].float(), -1)  # CPU reference
    want = -sum(float(logp[4 + i, t]) for i, t in enumerate(answer))
    assert math.isclose(_answer_nll(loaded, prompt, answer), want, rel_tol=1e-4)


def _utility_row(defense: str, agreed: list[int], positions: list[int], depth: int = 2) -> dict:
    return {"depth": depth, "defense": defense, "utility_by_sequence": {"agreed": agreed, "positions": positions}}


def test_denoiser_gains_pair_the_denoiser_with_its_base_row_over_the_same_sequences() -> None:
    base = "pclip(sigma=0.05,percentile=90.0,profile=ab)"
    rows = [_utility_row(base, [3, 4, 2, 5, 3, 4], [10] * 6),
            _utility_row(base + "+denoise(mode=learned,profile=cd)", [4, 5, 3, 6, 4, 5], [10] * 6),
            _utility_row("none", [10] * 6, [10] * 6)]
    (g,) = denoiser_gains(rows, n_boot=200)
    assert (g["base"], g["depth"], g["sequences"]) == (base, 2, 6)
    assert g["value"] == pytest.approx(0.1)  # one more agreed position in every sequence of 10
    assert g["ci_low"] == pytest.approx(0.1) and g["ci_high"] == pytest.approx(0.1)  # paired: the same gain each


def test_denoiser_gains_give_nothing_without_a_paired_base() -> None:
    base = "pclip(sigma=0.05,percentile=90.0,profile=ab)"
    den = base + "+denoise(mode=learned,profile=cd)"
    assert denoiser_gains([_utility_row(base, [3, 4], [10, 10]), _utility_row(den, [4, 5], [10, 12])]) == []
    assert denoiser_gains([_utility_row(base, [3, 4], [10, 10], depth=8), _utility_row(den, [4, 5], [10, 10])]) == []
    assert denoiser_gains([{"depth": 2, "defense": base}, _utility_row(den, [4, 5], [10, 10])]) == []  # older row
