"""The clip ablation: each variant releases what it says, and its rows measure the stage's utility."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.clip_ablation import AblatedNoise, main, run
from splitinfer.defenses.base import DefenseError
from splitinfer.defenses.noise import Noise, clip_rows


def _release(variant: str, x: torch.Tensor, sigma: float = 0.1) -> torch.Tensor:
    return AblatedNoise(sigma=sigma, clip=1.0, seed=3, variant=variant).apply(x.clone(), [0, 1, 2, 3], 7, "up")


def test_each_variant_clips_and_noises_the_positions_it_names() -> None:
    x = 5.0 * torch.randn(4, 16, generator=torch.Generator().manual_seed(0))  # (T, d), every norm > clip
    clipped = clip_rows(x, 1.0)
    full = Noise(sigma=0.1, clip=1.0, seed=3).apply(x.clone(), [0, 1, 2, 3], 7, "up")
    assert torch.equal(_release("defense", x), full)
    pos0 = _release("noise-pos0", x)
    assert torch.equal(pos0[0], full[0]) and torch.equal(pos0[1:], clipped[1:])
    rest = _release("noise-rest", x)
    assert torch.equal(rest[0], clipped[0]) and torch.equal(rest[1:], full[1:])
    keep = _release("keep-pos0", x)
    assert torch.equal(keep[0], x[0]) and torch.equal(keep[1:], full[1:])
    assert not torch.equal(full[0], clipped[0])  # the noise is there to be placed


def test_an_unknown_variant_is_refused() -> None:
    with pytest.raises(DefenseError, match="choose from"):
        AblatedNoise(variant="pos1")


def test_rows_follow_the_clip(tiny) -> None:
    kw = {"clip": 1e6, "test_tokens": 160, "sequences": 2, "corpora": ("prose",), "max_length": 32, "progress": False}
    loose = run(tiny, [2], [0.0], ["defense", "keep-pos0"], **kw)
    assert [r["next_token_agreement"] for r in loose] == [1.0, 1.0]  # a clip no state reaches changes nothing
    tight = run(tiny, [2], [0.0], ["defense"], **{**kw, "clip": 0.05})
    assert tight[0]["next_token_agreement"] < 1.0 and tight[0]["pos0_norm_mean"] > 0.05


def test_cli_writes_results_and_refuses_bad_input(tiny, tmp_path, capsys) -> None:
    assert main(["--model", "tiny-random", "--depths", "2", "--sigmas", "0,0.1", "--variants", "defense,noise-pos0",
                 "--clip", "1.0", "--test-tokens", "160", "--sequences", "2", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert len(doc["data"]["rows"]) == 4 and "noise-pos0" in (tmp_path / "report.md").read_text()
    for bad in (["--variants", "pos1"], ["--sigmas", "a"], ["--sigmas", "-1"], ["--depths", "9"]):
        with pytest.raises(SystemExit) as e:
            main(["--model", "tiny-random", "--out", str(tmp_path), *bad])
        assert e.value.code == 2
    assert "choose from" in capsys.readouterr().err
