"""shaped-noise: inverse-Fisher noise shape, its normalisation, and the Fisher estimate on the tiny model."""

import copy

import pytest
import torch

from splitinfer.defenses import DefensePipeline
from splitinfer.defenses.pclip import save_clips
from splitinfer.defenses.shaped_noise import ShapedNoise, fisher_diag, fisher_scale
from tests.devices import DEVICES, on_device


@pytest.fixture(autouse=True)
def profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLITINFER_PROFILES", str(tmp_path / "profiles"))


def test_scale_is_inverse_sqrt_fisher_with_unit_mean_square_and_cap():
    f = torch.tensor([4.0, 1.0, 1.0, 0.25])
    w = fisher_scale(f, power=0.5, cap=100.0)
    assert float(w.pow(2).mean()) == pytest.approx(1.0, rel=1e-5)
    assert float(w[3] / w[0]) == pytest.approx(4.0, rel=1e-2)  # sqrt(4 / 0.25)
    capped = fisher_scale(torch.tensor([1e6, 1.0, 1.0, 1.0]), power=0.5, cap=2.0)
    assert float(capped.max() / capped.min()) == pytest.approx(2.0, rel=1e-4)


def test_noise_per_dimension_follows_the_scale_and_matches_isotropic_power():
    scale = torch.tensor([0.5, 0.5, 1.5, 1.0])
    scale = scale / scale.pow(2).mean().sqrt()
    key = save_clips(torch.tensor([2.0, 2.0]), 50.0, {"t": 1}, {"scale": scale}, kind="shaped-noise")
    d = ShapedNoise(sigma=0.5, percentile=50.0, profile=key)
    y = d.apply(torch.zeros(20000, 4), [3] * 20000, 0, "up", content=list(range(20000)))
    std = y.std(0)
    assert torch.allclose(std, 0.5 * 2.0 * scale, rtol=0.03)
    assert float(y.pow(2).sum(-1).mean()) == pytest.approx(4 * (0.5 * 2.0) ** 2, rel=0.03)  # isotropic's power
    assert d.multiplier() == pytest.approx(0.5 * float(scale.min()) / 2)  # the least-noised direction
    assert DefensePipeline.parse(f"shaped-noise(sigma=0.5,percentile=50.0,profile={key})").label.startswith(
        "shaped-noise(sigma=0.5")


def _blind(model, dead, depth):
    """A copy of the tiny model whose layers after ``depth`` and LM head read nothing from dimensions ``dead``."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        out.lm_head.weight[:, dead] = 0.0  # tied: the embedding too (unused: states are edited at the split)
        for layer in out.model.layers[depth:]:
            for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.mlp.gate_proj,
                      layer.mlp.up_proj):
                m.weight[:, dead] = 0.0
    return out


def test_fisher_finds_the_dimensions_the_tail_never_reads(tiny):
    """On the tiny model with 8 dimensions made unread after the split, their Fisher is far below the others'
    (they still move the RMS norms), so shaped noise puts its largest scales there."""
    dead = list(range(8))
    model = _blind(tiny.model, dead, 2)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 200, (24,), generator=g).tolist() for _ in range(4)]
    before = [p.requires_grad for p in model.parameters()]  # the shared fixture's flags (other tests may freeze it)
    fisher = fisher_diag(model, 2, seqs)
    assert fisher.shape == (tiny.hidden_size,) and bool((fisher >= 0).all())
    assert float(fisher[dead].max()) < 0.2 * float(fisher[8:].median())
    w = fisher_scale(fisher, cap=10.0)
    assert float(w[dead].min()) > float(w[8:].max())
    assert [p.requires_grad for p in model.parameters()] == before  # fisher_diag restored them


@pytest.mark.parametrize("device", DEVICES)
def test_fisher_runs_on_the_models_device_with_the_cpu_draws(tiny, device):
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(3, 200, (12,), generator=g).tolist() for _ in range(2)]
    fisher = fisher_diag(on_device(tiny, device).model, 2, seqs, seed=4)
    assert fisher.shape == (tiny.hidden_size,) and bool(torch.isfinite(fisher).all()) and bool((fisher >= 0).all())
    if device == "cpu":  # the labels come from a CPU generator: the same draws as before, bit for bit
        assert torch.equal(fisher, fisher_diag(tiny.model, 2, seqs, seed=4))
