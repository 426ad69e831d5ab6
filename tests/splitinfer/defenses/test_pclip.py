"""pclip: per-position clips calibrated on public text, noise scaled to them, public positions untouched."""

import numpy as np
import pytest
import torch

from splitinfer.defenses import DefenseError, DefensePipeline
from splitinfer.defenses.noise import Noise
from splitinfer.defenses.pclip import PositionClip, calibrate_clips, save_clips


@pytest.fixture(autouse=True)
def profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLITINFER_PROFILES", str(tmp_path / "profiles"))


def test_calibrate_clips_per_position_and_public_left_out():
    # position 0: norms 100 (a sink); position 1: 1..5; positions >= 2 (k=2): 10..19; a public row of norm 1000
    norms = np.array([100.0] + [1, 2, 3, 4, 5] + list(range(10, 20)) + [1000.0])
    pos = np.array([0] + [1] * 5 + [2] * 5 + [7] * 5 + [3])
    public = np.zeros(len(norms), bool)
    public[-1] = True
    clips = calibrate_clips(norms, pos, public, 50.0, k=2)
    assert clips.tolist() == pytest.approx([100.0, 3.0, 14.5])
    assert calibrate_clips(norms, pos, public, 100.0, k=2).tolist() == pytest.approx([100.0, 5.0, 19.0])
    # a position without user text takes the shared clip
    assert calibrate_clips(norms[6:16], pos[6:16], None, 50.0, k=2).tolist() == pytest.approx([14.5, 14.5, 14.5])


def test_rows_clipped_to_their_position_and_public_rows_untouched():
    key = save_clips(torch.tensor([50.0, 2.0, 1.0]), 90.0, {"test": 1})
    d = PositionClip(sigma=0.0, percentile=90.0, profile=key)
    x = torch.randn(5, 16) * 100  # (T, d)
    y = d.apply(x, [0, 1, 2, 3, 4], 0, "up", public=[True, False, False, True, False])
    norms = y.norm(dim=-1)
    assert torch.equal(y[0], x[0])  # the public opening: neither clipped nor noised
    assert norms[1] == pytest.approx(2.0, rel=1e-4) and norms[2] == pytest.approx(1.0, rel=1e-4)
    # a public token after user text has attended to it: clipped like the rest
    assert norms[3] == pytest.approx(1.0, rel=1e-4) and norms[4] == pytest.approx(1.0, rel=1e-4)
    assert torch.equal(d.apply(x, [0, 1, 2, 3, 4], 0, "down"), x)  # replies pass


def test_noise_scales_with_the_position_clip():
    key = save_clips(torch.tensor([40.0, 4.0]), 50.0, {"test": 2})
    d = PositionClip(sigma=0.1, percentile=50.0, profile=key)
    x = torch.zeros(2000, 64)
    pos = [0] * 1000 + [5] * 1000
    y = d.apply(x, pos, 0, "up", content=list(range(2000)))
    assert float(y[:1000].std()) == pytest.approx(4.0, rel=0.02)  # sigma * C_0
    assert float(y[1000:].std()) == pytest.approx(0.4, rel=0.02)  # sigma * C_rest
    assert "DP per released vector" in d.describe() and d.epsilon() == Noise(sigma=0.1).epsilon()


def test_missing_or_mismatched_profile_is_one_line_error():
    with pytest.raises(DefenseError, match="calibrate one on public text"):
        PositionClip(sigma=0.1).apply(torch.ones(1, 4), [0], 0, "up")
    with pytest.raises(DefenseError, match="no profile 'abc'"):
        PositionClip(sigma=0.1, profile="abc").apply(torch.ones(1, 4), [0], 0, "up")
    key = save_clips(torch.tensor([1.0, 1.0]), 50.0, {"test": 3})
    with pytest.raises(DefenseError, match="percentile 50.0, not 90.0"):
        PositionClip(percentile=90.0, profile=key).apply(torch.ones(1, 4), [0], 0, "up")
    with pytest.raises(DefenseError, match="percentile"):
        DefensePipeline.parse("pclip(percentile=0)")


def test_pipeline_passes_public_mask_to_noise_and_pclip():
    """noise and pclip leave the public opening alone when the caller marks it (before: noise clipped the BOS),
    and defend a public token that follows user text (before: released untouched, its state having attended
    to the user's tokens)."""
    key = save_clips(torch.tensor([1.0, 1.0]), 50.0, {"test": 4})
    x = torch.randn(5, 32) * 10
    for spec in ("noise(sigma=0.1,clip=1.0)", f"pclip(sigma=0.1,percentile=50.0,profile={key})"):
        pipe = DefensePipeline.parse(spec)
        y = pipe.simulate_up(x.half(), [5, 6, 7, 8, 9], 0, public=[True, True, False, True, False])
        assert torch.equal(y[:2], x[:2].half().float())
        for k in (2, 3, 4):
            assert float(y[k].norm()) < 3.0 and not torch.equal(y[k], x[k].half().float())
        assert pipe.label.startswith(spec.split("(")[0])
