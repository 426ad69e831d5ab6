"""Keyed noise: clipping, the accountant, and draws that depend on the key alone."""

import math

import pytest
import torch

from splitinfer.defenses.keyed import keyed_normal, path_digests
from splitinfer.defenses.noise import Noise, clip_rows, gaussian_epsilon


def test_draws_depend_on_key_not_call_order():
    a = keyed_normal(1, 0, [0, 1, 2, 3], "up", 33)
    b = torch.cat([keyed_normal(1, 0, [p], "up", 33) for p in (3, 1, 0, 2)])
    assert torch.equal(a, b[[2, 1, 3, 0]])
    assert not torch.equal(a, keyed_normal(2, 0, [0, 1, 2, 3], "up", 33))
    assert not torch.equal(a, keyed_normal(1, 1, [0, 1, 2, 3], "up", 33))
    assert not torch.equal(a, keyed_normal(1, 0, [0, 1, 2, 3], "down", 33))


def test_draws_are_standard_normal():
    z = keyed_normal(0, 0, range(4000), "up", 64)
    assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1) < 0.01
    assert 0.002 < float((z.abs() > 3).float().mean()) < 0.0035  # two-sided 3-sigma tail: 0.0027


def test_path_digest_separates_siblings_and_matches_chain():
    chain = path_digests(0, [5, 6, 7])
    tree = path_digests(0, [5, 6, 9, 7], [-1, 0, 0, 1])  # 6 and 9 are siblings at position 1
    assert tree[1] == chain[1] and tree[3] == chain[2] and tree[2] != tree[1]
    same_pos = keyed_normal(0, 0, [1, 1], "up", 8, [tree[1], tree[2]])
    assert not torch.equal(same_pos[0], same_pos[1])


def test_clip_and_noise_scale():
    x = torch.randn(200, 64) * 10
    assert float(clip_rows(x, 2.0).norm(dim=-1).max()) <= 2.0 + 1e-5
    small = torch.full((1, 64), 0.01)
    assert torch.equal(clip_rows(small, 2.0), small)
    d = Noise(sigma=0.5, clip=2.0)
    y = d.apply(torch.zeros(500, 64), range(500), 0, "up")
    assert abs(float(y.std()) - 1.0) < 0.02  # sigma * clip
    assert torch.equal(d.apply(x, range(200), 0, "down"), x)  # replies off


def test_epsilon_from_the_accountant():
    assert gaussian_epsilon(1.0, 1e-5) == pytest.approx(4.73, abs=0.05)
    eps = [Noise(sigma=s, clip=1.0).epsilon() for s in (0.1, 1.0, 4.0, 10.0)]
    assert eps == sorted(eps, reverse=True) and math.isinf(Noise(sigma=0.0).epsilon())


@pytest.mark.parametrize("spec", ["noise(sigma=0.1,clip=2.0)", "pclip(sigma=0.1,percentile=90.0,profile={key})"])
def test_draws_keyed_by_the_text_alone_give_a_resent_text_the_same_noise(spec, tmp_path, monkeypatch):
    """Per session (the default) a resent text gets fresh draws, which an observer averages away; with
    per_session=false the same token path gets the same draw in every session, and other paths other draws."""
    from splitinfer.defenses import DefensePipeline
    from splitinfer.defenses.pclip import save_clips

    monkeypatch.setenv("SPLITINFER_PROFILES", str(tmp_path))
    spec = spec.format(key=save_clips(torch.tensor([2.0, 1.5, 2.5]), 90.0, {"t": 0}))
    h, tokens = torch.randn(6, 16).half() * 5, [3, 1, 4, 1, 5, 9]
    fresh, same = (DefensePipeline.parse(spec, {spec.split("(")[0] + ".per_session": v}) for v in (True, False))
    assert not torch.equal(fresh.simulate_up(h, tokens, 0), fresh.simulate_up(h, tokens, 7))
    assert torch.equal(same.simulate_up(h, tokens, 0), same.simulate_up(h, tokens, 7))
    other = same.simulate_up(h, [3, 1, 4, 2, 5, 9], 7)  # another path from position 3 on
    assert torch.equal(other[:3], same.simulate_up(h, tokens, 0)[:3]) and not torch.equal(other[3:], same.simulate_up(h, tokens, 0)[3:])
    assert "per_session=false" in same.label


def test_draws_keyed_by_the_text_need_the_text():
    from splitinfer.defenses.base import DefenseError

    with pytest.raises(DefenseError, match="per_session=false keys its draws by the token path"):
        Noise(sigma=0.1, clip=2.0, per_session=False).apply(torch.zeros(2, 8), [0, 1], 3, "up")
