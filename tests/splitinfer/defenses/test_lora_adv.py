"""lora-adv: the training adversary is seeded on the CPU and trains beside the head states (any device)."""

import json

import pytest
import torch

from splitinfer.defenses.lora_adv import Adversary, check_fresh, train_adversarial_adapter
from tests.devices import DEVICES, on_device

TEXT = ["The clinic moved your appointment to Tuesday at 10:30; call 555-0199 to confirm. " * 4]


def test_the_adversary_is_initialised_as_a_seeded_linear_layer():
    torch.manual_seed(5)
    ref = torch.nn.Linear(8, 11)
    adv = Adversary(8, 11, 0.1, seed=5)
    assert torch.equal(adv.linear.weight, ref.weight) and torch.equal(adv.linear.bias, ref.bias)


@pytest.mark.parametrize("device", DEVICES)
def test_adapter_trains_against_the_adversary_on_the_models_device(tiny, tmp_path, device):
    loaded = on_device(tiny, device)
    out = train_adversarial_adapter(loaded, 2, TEXT, tmp_path / "adv", rank=2, steps=3, weight=0.1, seq_len=16)
    meta = json.loads((out / "adapter.json").read_text())
    assert meta["defense"] == "lora-adv" and meta["steps"] == 3 and meta["train_attacker_final_ce"] > 0
    fresh = torch.nn.Linear(tiny.hidden_size, int(tiny.config.vocab_size))
    check_fresh(fresh, out)  # a fresh attacker passes
