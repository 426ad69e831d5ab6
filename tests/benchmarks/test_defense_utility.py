"""defense_utility: teacher-forced agreement, perplexity and answer NLL on the model's own device."""

import math

import pytest
import torch

from benchmarks.defense_utility import _answer_nll, clean_logits, teacher_forced
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
    assert got["perplexity"]["value"] == pytest.approx(got["perplexity_undefended"]["value"], rel=1e-4)
    assert all(t.device.type == device for t in clean_logits(loaded, seqs, cache))
    prompt, answer = seqs[0][:5], seqs[0][5:]
    with torch.no_grad():
        logp = torch.log_softmax(tiny.model(torch.tensor([seqs[0]])).logits[0].float(), -1)  # CPU reference
    want = -sum(float(logp[4 + i, t]) for i, t in enumerate(answer))
    assert math.isclose(_answer_nll(loaded, prompt, answer), want, rel_tol=1e-4)
