"""permute: a secret orthogonal basis on the wire, with transformed body weights (tiny-random model)."""

import pytest
import torch

from splitinfer.client import SplitModel, body_info
from splitinfer.defenses import DefenseError, DefensePipeline
from splitinfer.defenses.permute import basis, fold_and_rotate
from splitinfer.link import InProcessLink
from splitinfer.partition import CloudBody, SplitConfig
from splitinfer.session import BodyService
from tests.splitinfer.decoding.exact import check_same
from tests.splitinfer.defenses.test_wire import PROMPT, _Recorder
from tests.devices import DEVICES, on_device


@pytest.mark.parametrize("mode", ["signed", "rotation"])
def test_the_basis_is_orthogonal_and_keyed_by_the_seed(mode):
    q = basis(mode, 7, 48)
    assert torch.allclose(q @ q.T, torch.eye(48, dtype=torch.float64), atol=1e-12)
    assert torch.equal(q, basis(mode, 7, 48)) and not torch.equal(q, basis(mode, 8, 48))
    if mode == "signed":  # one +-1 per row and column
        assert torch.equal(q.abs().sum(0), torch.ones(48, dtype=torch.float64)) and set(q.unique().tolist()) == {
            -1.0, 0.0, 1.0}


@pytest.mark.parametrize("mode", ["signed", "rotation"])
def test_transformed_body_gives_the_undefended_output(tiny, mode):
    def run(defense):  # fp32 wire: the rotation's own rounding is the only difference
        return SplitModel(tiny, "2,1", defense=defense, wire_dtype="fp32").generate(PROMPT, 12, record_logits=True)

    check_same(run(f"permute(mode={mode},seed=2)"), run("none"))


def test_the_cloud_sees_the_rotated_states_and_its_weights_change_not_the_models(tiny):
    pipe = DefensePipeline.parse("permute(mode=rotation,seed=1)")
    w = tiny.model.model.layers[2].self_attn.q_proj.weight.clone()
    split = SplitConfig.parse("2,1")
    body = CloudBody.from_model(tiny.model, split)
    pipe.apply_body(body, tiny.hidden_size)  # a Link's caller hands its body the transformed weights
    service = BodyService(body, body_info(tiny.spec, split, body, tiny.hidden_size, tiny.num_layers), defense=pipe)
    service.body = _Recorder(service.body)
    sm = SplitModel(tiny, split, cloud=InProcessLink(service), defense=pipe, wire_dtype="fp32")
    res = sm.generate(PROMPT, 4, record_logits=True)
    ids = sm.encode_prompt(PROMPT)
    head = sm.head(torch.tensor([ids]), torch.arange(len(ids)), sm.head.new_cache())[0]  # (T, d)
    q = pipe.get("permute").matrix(tiny.hidden_size).float()
    got = service.body.inputs[0]
    assert torch.allclose(got, head @ q, atol=1e-5) and not torch.allclose(got, head, atol=1e-1)
    assert torch.equal(tiny.model.model.layers[2].self_attn.q_proj.weight, w)  # private copies only
    check_same(res, SplitModel(tiny, split, wire_dtype="fp32").generate(PROMPT, 4, record_logits=True))


def test_bad_mode_unsupported_layers_and_a_served_body_are_one_line_errors(tiny):
    with pytest.raises(DefenseError, match="mode='shuffle'; choose one of signed, rotation"):
        DefensePipeline.parse("permute(mode=shuffle)")
    with pytest.raises(DefenseError, match="Llama-style decoder layers"):
        fold_and_rotate(torch.nn.Linear(4, 4), basis("signed", 0, 4))
    with pytest.raises(DefenseError, match="cannot ship them yet"):
        SplitModel(tiny, "2,1", cloud="ws://127.0.0.1:9", defense="permute")


@pytest.mark.parametrize("device", DEVICES)
def test_the_transformed_body_on_the_models_device(tiny, device):
    loaded = on_device(tiny, device)
    layer = loaded.model.model.layers[2]
    q = basis("rotation", 2, tiny.hidden_size)  # drawn on the CPU
    out = fold_and_rotate(layer, q)
    assert next(out.parameters()).device == next(layer.parameters()).device
    want = (q.T @ tiny.model.model.layers[2].mlp.down_proj.weight.double()).float()  # the CPU fold
    assert torch.allclose(out.mlp.down_proj.weight.cpu(), want, atol=1e-5)
