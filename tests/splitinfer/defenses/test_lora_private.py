"""lora-private: an adapter trained by distillation moves the head's states, keeps the outputs close, stays local."""

import json

import pytest
import torch

from splitinfer.client import SplitModel
from splitinfer.defenses import DefenseError, DefensePipeline
from splitinfer.defenses.lora_private import train_adapter
from tests.devices import DEVICES, on_device

TEXT = ["Dear Ann, the clinic moved your appointment to Tuesday at 10:30; call 555-0199 to confirm. " * 6]


@pytest.fixture(scope="module")
def adapter(tiny, tmp_path_factory):
    return train_adapter(tiny, 2, TEXT, tmp_path_factory.mktemp("adapter"), rank=4, steps=25, lr=5e-3, seq_len=32)


def test_adapter_files_and_private_split(tiny, adapter):
    meta = json.loads((adapter / "adapter.json").read_text())
    assert meta["rank"] == 4 and meta["depth"] == 2 and meta["base_sha256"] == tiny.sha256
    spec = f"lora-private(adapter={adapter},rank=4,steps=25)"
    pipe = DefensePipeline.parse(spec)
    assert pipe.public_label == "none" and "adapter" not in pipe.items[0].label(public=True)
    ids = tiny.tokenizer(TEXT[0], add_special_tokens=False)["input_ids"][:40]
    teacher = torch.log_softmax(tiny.model(torch.tensor([ids])).logits[0].float(), -1)
    moved, kl = {}, {}
    clean = SplitModel(tiny, "2,1")
    h0 = clean.head(torch.tensor([ids]), torch.arange(len(ids)), clean.head.new_cache())
    for name, d in (("private", pipe), ("random", "lora-random(rank=4,scale=0.3)")):
        m = SplitModel(tiny, "2,1", defense=d)
        h = m.head(torch.tensor([ids]), torch.arange(len(ids)), m.head.new_cache())
        moved[name] = float((h - h0).norm() / h0.norm())
        logits = m.sequence_logits(ids)
        kl[name] = float(torch.nn.functional.kl_div(torch.log_softmax(logits, -1), teacher, log_target=True,
                                                    reduction="batchmean"))
    assert moved["private"] > 1e-3  # the states the cloud sees moved
    assert kl["private"] < kl["random"], (moved, kl)  # distillation keeps the outputs closer than a random move


def test_missing_or_mismatched_adapter(tiny, adapter):
    with pytest.raises(DefenseError, match="no adapter at"):
        SplitModel(tiny, "2,1", defense="lora-private(adapter=/nonexistent)")
    with pytest.raises(DefenseError, match="covers 2 layers at rank 4"):
        SplitModel(tiny, "3,1", defense=f"lora-private(adapter={adapter},rank=4)")


def test_an_adapter_is_refused_on_other_base_weights(tiny, adapter, tmp_path):
    import copy
    import shutil

    other = copy.deepcopy(tiny)
    with torch.no_grad():
        other.model.model.layers[1].mlp.down_proj.weight.add_(1e-3)  # a fine-tuned or different base
    spec = f"lora-private(adapter={adapter},rank=4,steps=25)"
    with pytest.raises(DefenseError, match="trained on other base weights or dtype \\(head layer 1 differs"):
        SplitModel(other, "2,1", defense=spec)
    SplitModel(other, "1,1", defense=spec)  # layer 0 is the same: the adapter still fits that head
    old = shutil.copytree(adapter, tmp_path / "old")
    meta = json.loads((old / "adapter.json").read_text())
    del meta["layer_sha256"]
    (old / "adapter.json").write_text(json.dumps(meta))
    with pytest.raises(DefenseError, match="does not record the base layers"):
        SplitModel(tiny, "2,1", defense=f"lora-private(adapter={old},rank=4,steps=25)")


@pytest.mark.parametrize("device", DEVICES)
def test_an_adapter_trains_on_the_models_device_and_applies_there(tiny, tmp_path, device):
    loaded = on_device(tiny, device)
    out = train_adapter(loaded, 2, TEXT, tmp_path / "a", rank=2, steps=2, seq_len=16)
    sm = SplitModel(loaded, "2,2", defense=DefensePipeline.parse(f"lora-private(adapter={out},rank=2,steps=2)"))
    ids = tiny.tokenizer(TEXT[0], add_special_tokens=False)["input_ids"][:12]
    logits = sm.sequence_logits(ids)
    assert logits.device.type == device and bool(torch.isfinite(logits).all())


def test_training_windows_open_with_the_tokenizers_bos_and_carry_no_other():
    """A BOS model's adapter trains on windows that open as its texts do (before: 64-token cuts of the texts
    concatenated, so a window began mid-text without the BOS, which Gemma 3 never sees, and held BOS mid-way)."""
    from splitinfer.defenses.lora_private import training_windows
    from splitinfer.models import tiny_tokenizer
    from tests.splitinfer.test_tokens import llama_style_tokenizer

    tok = llama_style_tokenizer()
    texts = ["Dear Ann, the clinic moved your appointment.", "Call 555-0199 to confirm it, please."]
    windows, n_prefix = training_windows(tok, texts, 16)
    assert n_prefix == 1 and windows.shape[1] == 16
    assert (windows[:, 0] == tok.bos_token_id).all() and (windows[:, 1:] != tok.bos_token_id).all()
    text_ids = [t for x in texts for t in tok(x, add_special_tokens=False)["input_ids"]]
    assert windows[:, 1:].reshape(-1).tolist() == text_ids[: windows[:, 1:].numel()]  # packed in order
    plain, none = training_windows(tiny_tokenizer(), texts, 16)  # no prefix: the texts cut every 16, as before
    ids = [t for x in texts for t in tiny_tokenizer()(x, add_special_tokens=False)["input_ids"]]
    assert none == 0 and plain.reshape(-1).tolist() == ids[: len(ids) // 16 * 16]
    with pytest.raises(DefenseError, match="give seq_len >= 3"):
        training_windows(tok, texts, 2)


def test_the_regulariser_reads_the_text_positions_not_the_public_bos(tiny, tmp_path, capsys):
    from splitinfer.models import LoadedModel
    from tests.splitinfer.test_tokens import llama_style_tokenizer

    tok = llama_style_tokenizer()
    loaded = LoadedModel(tiny.model, tok, "tiny-bos", tiny.sha256, None)
    seen = []

    def regulariser(states, ids):
        seen.append((tuple(states.shape), ids.clone()))
        return states.sum() * 0.0

    train_adapter(loaded, 2, TEXT, tmp_path, rank=2, steps=2, seq_len=16, batch=2, regulariser=regulariser)
    assert [s for s, _ in seen] == [(2, 15, tiny.hidden_size)] * 2
    assert all((ids != tok.bos_token_id).all() for _, ids in seen)
    assert "head adapter" in capsys.readouterr().err  # a progress bar over the training steps (before: silent)
