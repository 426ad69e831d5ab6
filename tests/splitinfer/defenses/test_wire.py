"""Defenses on the wire of a real split (tiny-random model): what the cloud receives, bytes, exactness, hello."""

import pytest
import torch

from splitinfer.client import SplitModel, body_info
from splitinfer.defenses import DefensePipeline
from splitinfer.errors import SplitInferError
from splitinfer.link import InProcessLink
from splitinfer.partition import CloudBody, SplitConfig
from splitinfer.protocol import decode_frame
from splitinfer.session import BodyService
from tests.splitinfer.decoding.exact import check_same

PROMPT = "the cat sat on the mat and the cat sat on the mat and the cat"


class _Recorder(torch.nn.Module):
    """Wraps the cloud body: keeps every input it runs on."""

    def __init__(self, body):
        super().__init__()
        self.body, self.inputs = body, []

    def forward(self, hidden, *args):
        self.inputs.append(hidden[0].clone())
        return self.body(hidden, *args)


def _tapped(tiny, **kw):
    """A split whose in-process cloud records every frame it receives and every state its body runs on."""
    split = SplitConfig.parse("2,1")
    body = CloudBody.from_model(tiny.model, split)
    defense = kw.pop("defense", None)
    defense = DefensePipeline.parse(defense) if isinstance(defense, str) else defense
    service = BodyService(body, body_info(tiny.spec, split, body, tiny.hidden_size, tiny.num_layers), defense=defense)
    frames, handle = [], service.handle
    service.handle = lambda data, owner=None: (frames.append(decode_frame(data)), handle(data, owner))[1]
    service.body = _Recorder(service.body)
    sm = SplitModel(tiny, split, cloud=InProcessLink(service), defense=defense, **kw)
    return sm, service.body.inputs, frames


def _run(tiny, defense, **kw):
    sm, inputs, frames = _tapped(tiny, defense=defense)
    res = sm.generate(PROMPT, 8, record_logits=True, **kw)
    return sm, res, inputs, [f for f in frames if f.op == "forward"]


def test_undefended_path_is_unchanged(tiny):
    ref, ref_inputs, ref_frames = _tapped(tiny)  # the constructor as before defenses existed
    res_ref = ref.generate(PROMPT, 8, record_logits=True)
    sm, res, inputs, frames = _run(tiny, "none")
    check_same(res, res_ref, bitwise=True)
    fwd = [f for f in ref_frames if f.op == "forward"]
    assert [set(f.tensors) for f in frames] == [{"hidden"}] * len(frames)
    assert all(f.tensors["hidden"].dtype == torch.float16 for f in frames)
    assert all(set(f.fields) <= {"session", "positions", "parents", "keep"} for f in frames)
    assert all(torch.equal(a.tensors["hidden"], b.tensors["hidden"]) for a, b in zip(frames, fwd))
    assert all(torch.equal(a, b) for a, b in zip(inputs, ref_inputs))
    hello = next(f for f in ref_frames if f.op == "hello")
    assert "defense" not in hello.fields and res.summary()["defense"] == "none"
    # An oracle outside the defense code: the prefill frame carries the head's own states cast to the wire
    # dtype, bit for bit, and the body runs on exactly those values.
    ids = sm.encode_prompt(PROMPT)
    head = sm.head(torch.tensor([ids]), torch.arange(len(ids)), sm.head.new_cache())[0].to(sm.wire_dtype)  # (T, d)
    assert torch.equal(frames[0].tensors["hidden"][0], head)
    assert torch.equal(inputs[0], head.to(inputs[0].dtype))


@pytest.mark.parametrize("fmt", ["int8", "fp8", "int4"])
def test_quantised_wire_cloud_sees_exactly_the_dequantised_values(tiny, fmt):
    pipe = DefensePipeline.parse(f"quant(format={fmt},group=16)")
    sm, res, inputs, frames = _run(tiny, pipe)
    assert all(set(f.tensors) == {"hidden_q", "hidden_scale"} for f in frames)
    assert all(f.tensors["hidden_q"].dtype == torch.uint8 for f in frames)
    # Replay the head on the prompt: the body ran on dequantize(quantize(fp16 head states)), exactly.
    ids = sm.encode_prompt(PROMPT)
    cache = sm.head.new_cache()
    head = sm.head(torch.tensor([ids]), torch.arange(len(ids)), cache)[0].to(sm.wire_dtype)  # (T, d)
    assert torch.equal(inputs[0], pipe.codec.roundtrip(head))
    assert not torch.equal(inputs[0], head.float())
    assert res.summary()["defense"] == pipe.label


def test_measured_bytes_fall_with_the_format(tiny):
    per_value = {}
    for spec in ("none", "quant(format=int8)", "quant(format=fp8)", "quant(format=int4)"):
        res = SplitModel(tiny, "2,1", defense=spec).generate(PROMPT * 4, 2)
        prefill = res.steps[0]
        per_value[spec] = (prefill.bytes_up, prefill.bytes_down)
    up16, down16 = per_value["none"]
    for spec, ratio in (("quant(format=int8)", 0.5), ("quant(format=fp8)", 0.5), ("quant(format=int4)", 0.25)):
        up, down = per_value[spec]
        # fp16 -> 1 byte (or half a byte) per value, plus a float32 scale per token (per group for int4)
        assert up < (ratio + 0.2) * up16 and down < (ratio + 0.2) * down16, (spec, up, up16)
    assert per_value["quant(format=int4)"][0] < per_value["quant(format=int8)"][0]


def test_noise_is_what_the_cloud_receives_and_keyed(tiny):
    sm, res, inputs, frames = _run(tiny, "noise(sigma=0.5,clip=4.0,seed=3)")
    ids = sm.encode_prompt(PROMPT)
    head = sm.head(torch.tensor([ids]), torch.arange(len(ids)), sm.head.new_cache())[0].to(sm.wire_dtype)
    expect = sm.defense.simulate_up(head, ids, session=0)
    assert torch.equal(inputs[0], expect.to(sm.wire_dtype).float())
    assert float((inputs[0] - head.float()).std()) > 1.0  # sigma * clip = 2 (plus the clipping)
    other = DefensePipeline.parse("noise(sigma=0.5,clip=4.0,seed=4)").simulate_up(head, ids, session=0)
    assert not torch.equal(expect, other)


@pytest.mark.parametrize("defense", ["noise(sigma=0.02,clip=4.0,seed=1)", "noise(sigma=0.02,clip=4.0)+quant"])
def test_speculative_equals_sequential_under_the_same_defense(tiny, defense):
    def run(**kw):  # fp32 wire: an fp16 cast would round states that differ by 1e-7 one ulp apart
        sm = SplitModel(tiny, "2,1", defense=defense, wire_dtype="fp32")
        return sm.generate(PROMPT, 24, record_logits=True, **kw)

    seq, spec = run(), run(decoding="prompt-lookup")
    assert spec.token_ids == seq.token_ids
    assert len(spec.steps) < len(seq.steps)  # drafts were accepted: the speculative path really ran
    if "quant" not in defense:  # a 1e-7 change of a state can move a quantisation code; tokens still agree
        check_same(spec, seq)


def test_hello_refuses_a_defense_mismatch(tiny):
    split = SplitConfig.parse("2,1")
    body = CloudBody.from_model(tiny.model, split)
    info = body_info(tiny.spec, split, body, tiny.hidden_size, tiny.num_layers)
    with pytest.raises(SplitInferError, match=r"defense mismatch: the client runs 'quant\(format=int8\)' but"):
        SplitModel(tiny, split, cloud=InProcessLink(BodyService(body, info)), defense="quant")
    server = BodyService(body, info, defense=DefensePipeline.parse("quant(format=int4,group=16)"))
    with pytest.raises(SplitInferError, match="defense mismatch: the client runs 'none'"):
        SplitModel(tiny, split, cloud=InProcessLink(server))
    # the noise seed is the client's secret: a cloud that need not know it accepts any
    SplitModel(tiny, split, cloud=InProcessLink(BodyService(body, info)), defense="noise(seed=5)")


def test_lora_random_changes_only_the_private_head_copy(tiny):
    w = tiny.model.model.layers[0].mlp.up_proj.weight.clone()
    sm, res, inputs, _ = _run(tiny, "lora-random(rank=2,scale=0.3,seed=1)")
    clean = SplitModel(tiny, "2,1")
    ids = sm.encode_prompt(PROMPT)
    a = sm.head(torch.tensor([ids]), torch.arange(len(ids)), sm.head.new_cache())
    b = clean.head(torch.tensor([ids]), torch.arange(len(ids)), clean.head.new_cache())
    assert not torch.allclose(a, b, atol=1e-3)
    assert torch.equal(tiny.model.model.layers[0].mlp.up_proj.weight, w)
    assert len(res.token_ids) == 8


def test_random_split_is_refused_by_the_runtime(tiny):
    with pytest.raises(SplitInferError, match="use it in `splitinfer attack`"):
        SplitModel(tiny, "2,1", defense="random-split")


def test_reply_noise_is_added_where_the_body_replies(tiny):
    spec = "noise(sigma=0.2,clip=4.0,replies=true)"
    sm, inputs, frames = _tapped(tiny, defense=spec)
    outputs = []
    body = sm.link.service.body
    sm.link.service.body = lambda h, *a: (outputs.append(body(h, *a)), outputs[-1])[1]
    ids = sm.encode_prompt(PROMPT)
    sm.remote.open()
    _, _, (_, back, _) = sm.forward_step(sm.head.new_cache(), sm.tail.new_cache(), ids, list(range(len(ids))),
                                         return_states=True)
    sm.remote.close()
    clean = outputs[0][0].to(sm.wire_dtype)  # (T, d) the body's reply before the defense
    expect = DefensePipeline.parse(spec).transforms[0].apply(clean, range(len(ids)), 0, "down")
    assert torch.equal(back, expect.float()) and not torch.equal(back, clean.float())
    assert sm.defense.public_label == spec  # the cloud must know: the hello carries it (without the seed)
