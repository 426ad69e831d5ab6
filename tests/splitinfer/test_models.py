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


class _Tok:
    """A tokenizer that adds (or not) a BOS token when asked for special tokens."""

    def __init__(self, bos, adds):
        self.bos_token_id, self.adds = bos, adds

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": ([self.bos_token_id] if self.adds and add_special_tokens else []) + [7]}


def test_a_tokenizer_that_puts_a_bos_first_is_flagged():
    """Gemma 3's tokenizer adds its BOS (id 2) and the model needs it; SmolLM2's adds none. splitinfer tokenises
    without special tokens, so such a model is flagged at load (perplexity 319 without BOS, 10.5 with)."""
    from splitinfer.models import expects_bos

    assert expects_bos(_Tok(2, True))
    assert not expects_bos(_Tok(1, False))
    assert not expects_bos(_Tok(None, False))


def test_the_tiny_model_is_not_flagged(caplog):
    with caplog.at_level("WARNING", logger="splitinfer.models"):
        load_model("tiny-random")
    assert "expects a BOS token" not in caplog.text
