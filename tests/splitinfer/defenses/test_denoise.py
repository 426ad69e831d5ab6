"""denoise: the local denoiser wins utility back under noise on the tiny model, and changes nothing on the wire."""

import pytest
import torch

from splitinfer.client import SplitModel
from splitinfer.defenses import DefenseError, DefensePipeline
from splitinfer.defenses.denoise import denoiser_pairs, train_denoiser
from splitinfer.defenses.keyed import path_digests
from splitinfer.defenses.pclip import save_clips
from splitinfer.defenses.pipeline import exact_rows
from splitinfer.defenses.profiles import save_profile
from tests.devices import DEVICES, on_device


@pytest.fixture(autouse=True)
def profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLITINFER_PROFILES", str(tmp_path / "profiles"))


def _seqs(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 250, (24,), generator=g).tolist() for _ in range(n)]


def _agreement(tiny, spec, seqs):
    """Next-token agreement with the undefended model, teacher-forced through the runtime (the stage's measure)."""
    sm = SplitModel(tiny, "2,2", defense=DefensePipeline.parse(spec))
    agree = n = 0
    for seq in seqs:
        with torch.no_grad():
            clean = tiny.model(torch.tensor([seq])).logits[0]
        logits = sm.sequence_logits(seq)
        agree += int((logits.argmax(-1) == clean.argmax(-1)).sum())
        n += len(seq)
    return agree / n


def test_denoiser_utility_gain_on_tiny_model(tiny):
    key = save_clips(torch.full((2,), 8.0), 50.0, {"test": "denoise"})
    noise = f"pclip(sigma=0.1,percentile=50.0,profile={key})"
    pairs = denoiser_pairs(tiny.model, 2, 4, DefensePipeline.parse(noise), _seqs(24, 1))
    dkey, report = train_denoiser(pairs, {"test": 1}, hidden=64, epochs=60)
    assert report["val_rel_err_learned"] <= report["val_rel_err_subtract"]
    held = _seqs(6, 2)  # other sequences than the denoiser's
    alone = _agreement(tiny, noise, held)
    subtract = _agreement(tiny, noise + "+denoise(mode=subtract)", held)
    learned = _agreement(tiny, noise + f"+denoise(profile={dkey})", held)
    assert alone < 0.9  # the noise costs utility
    assert subtract > alone + 0.1 and learned >= subtract - 0.02


def test_denoiser_changes_nothing_the_cloud_sees():
    key = save_clips(torch.full((2,), 8.0), 50.0, {"test": "wire"})
    noise = f"pclip(sigma=0.1,percentile=50.0,profile={key})"
    x = torch.randn(5, 16).half()
    a = DefensePipeline.parse(noise).simulate_up(x, [1, 2, 3, 4, 5], 3)
    b = DefensePipeline.parse(noise + "+denoise(mode=subtract)").simulate_up(x, [1, 2, 3, 4, 5], 3)
    assert torch.equal(a, b)


def test_denoiser_needs_noise_and_a_profile():
    with pytest.raises(DefenseError, match="compose it with one"):
        DefensePipeline.parse("denoise(mode=subtract)")
    with pytest.raises(DefenseError, match="mode='x'"):
        DefensePipeline.parse("noise+denoise(mode=x)")
    pipe = DefensePipeline.parse("noise(sigma=0.1,clip=1.0)+denoise")
    pipe.transform_up(torch.ones(1, 2, 4), [0, 1], 0)
    with pytest.raises(DefenseError, match="calibrate one on public text"):
        pipe.restore_down(torch.ones(1, 2, 4))


@pytest.mark.parametrize("device", DEVICES)
def test_the_denoiser_trains_and_runs_on_the_models_device(tiny, device):
    loaded = on_device(tiny, device)
    key = save_clips(torch.full((2,), 8.0), 50.0, {"test": f"device-{device}"})
    noise = f"pclip(sigma=0.1,percentile=50.0,profile={key})"
    pairs = denoiser_pairs(loaded.model, 2, 4, DefensePipeline.parse(noise), _seqs(4, 1))
    dkey, _ = train_denoiser(pairs, {"test": device}, hidden=16, epochs=10)
    sm = SplitModel(loaded, "2,2", defense=DefensePipeline.parse(noise + f"+denoise(profile={dkey})"))
    logits = sm.sequence_logits(_seqs(1, 3)[0])
    assert logits.device.type == device and bool(torch.isfinite(logits).all())


def test_denoiser_pairs_leave_out_the_public_opening(tiny):
    """The pairs see what the runtime releases (the public opening untouched) and hold only the rows the
    denoiser corrects: the opening comes back exact, so it is not in them."""
    key = save_clips(torch.full((2,), 8.0), 50.0, {"test": "denoise-public"})
    noise = DefensePipeline.parse(f"pclip(sigma=0.1,percentile=50.0,profile={key})")
    seqs = _seqs(2, 5)
    pairs = denoiser_pairs(tiny.model, 2, 4, noise, seqs, public=[3, 0])
    delta = pairs["delta"]  # (N, d)
    assert delta.shape[0] == 2 * 24 - 3 and bool((delta.abs().sum(-1) > 0).all())


def test_exact_rows_counts_the_untouched_rows_at_the_sequence_start():
    delta = torch.zeros(5, 4)
    delta[2:, 0] = 1.0  # rows 2.. perturbed
    assert exact_rows(delta, 0) == 2
    assert exact_rows(delta, 7) == 0  # a later step: earlier rows were perturbed, nothing is exact
    assert exact_rows(torch.zeros(3, 4), 0) == 3


def _biased_denoiser(d):
    """A learned denoiser whose correction is far from zero everywhere (its output bias)."""
    t = {"w1": torch.zeros(4, 2 * d), "b1": torch.zeros(4), "w2": torch.zeros(d, 4), "b2": torch.ones(d),
         "s_y": torch.ones(1), "s_d": torch.ones(1)}
    return save_profile("denoise", t, {"test": "biased"})


def test_the_denoiser_returns_the_untouched_opening_as_received():
    """The public opening, released untouched at the sequence start, comes back exact: the denoiser must not
    move it (a correction there moved the attention-sink state every later position reads)."""
    clip = save_clips(torch.full((2,), 8.0), 50.0, {"test": "denoise-exact"})
    pipe = DefensePipeline.parse(f"pclip(sigma=0.1,percentile=50.0,profile={clip})"
                                 f"+denoise(profile={_biased_denoiser(16)})")
    hidden = torch.randn(1, 5, 16) * 20
    public = [True, True, False, False, False]
    pipe.transform_up(hidden, range(5), 3, path_digests(0, [1, 2, 3, 4, 5]), public)
    back = torch.randn(1, 5, 16)
    out = pipe.restore_down(back.clone())
    assert torch.equal(out[0, :2], back[0, :2])  # the opening as received
    assert not torch.allclose(out[0, 2:], back[0, 2:])  # user text corrected
    pipe.transform_up(hidden[:, :1], [5], 3, path_digests(5, [6]), [True])  # a later step: nothing exact
    assert not torch.allclose(pipe.restore_down(back[:, :1].clone()), back[:, :1])
