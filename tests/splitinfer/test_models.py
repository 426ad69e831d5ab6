import pytest
import torch

from splitinfer.errors import SplitInferError
from splitinfer.models import load_model, weights_sha256


def test_tiny_random_is_seeded(tiny):
    again = load_model("tiny-random")
    assert again.sha256 == tiny.sha256
    assert load_model("tiny-random", seed=1).sha256 != tiny.sha256
    assert tiny.num_layers == 6 and tiny.hidden_size == 64


def test_sha_changes_with_any_weight(tiny):
    import copy

    m = copy.deepcopy(tiny.model)
    with torch.no_grad():
        m.model.layers[3].mlp.down_proj.weight[0, 0] += 1e-3
    assert weights_sha256(m) != tiny.sha256


def test_local_directory_spec(tiny, tiny_dir):
    loaded = load_model(str(tiny_dir))
    assert loaded.sha256 == tiny.sha256 and loaded.weights_dir == tiny_dir


def test_directory_without_config(tmp_path):
    with pytest.raises(SplitInferError, match="no config.json"):
        load_model(str(tmp_path))


def test_hub_id_failure_is_a_clear_error(monkeypatch):
    """Hub ids go to from_pretrained; its OSError (no network, no such repo) becomes one line."""
    import splitinfer.models as models

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to the hub to load this file.\nCheck your connection.")

    monkeypatch.setattr(models, "_from_dir", offline)
    with pytest.raises(SplitInferError, match="could not load 'no-such-org/no-such-model'"):
        load_model("no-such-org/no-such-model")
