"""Wire taps: what the cloud receives and returns during real split generation, drafts and trees included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from attacks.errors import AttackError
from attacks.taps import TruncatedForward
from attacks.wiretap import TapLink, WireTap, record_generations
from splitinfer.client import SplitModel
from splitinfer.link import InProcessLink

PROMPT = "Once upon a time, Ada wrote"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))


def teacher_forced(loaded, boundary: str, ids: list[int]) -> torch.Tensor:
    return TruncatedForward.for_boundary(loaded, boundary)(torch.tensor([ids]))[0]  # (n, d)


def test_greedy_generation_taps_equal_teacher_forced_taps(tiny, tmp_path: Path) -> None:
    """Acceptance: recorded head-boundary states equal teacher-forced taps of prompt + output (fp32 wire)."""
    sm = SplitModel(tiny, "2,2", wire_dtype="fp32")
    with WireTap(sm) as wt:
        res = sm.generate(PROMPT, 12, stop_on_eos=False)
    assert sm.link is not wt.link and sm.remote.link is sm.link  # restored on exit
    ids = res.prompt_ids + res.token_ids[:-1]  # the last token is chosen but never sent
    steps = wt.steps
    assert len(steps) == 12 and [len(s.positions) for s in steps] == [len(res.prompt_ids)] + [1] * 11
    assert sum((s.token_ids for s in steps), []) == ids
    assert sum((s.positions for s in steps), []) == list(range(len(ids)))
    assert all(s.parents is None and s.keep is None and all(s.kept) for s in steps)
    sent = torch.cat([s.sent for s in steps])  # (n, d)
    back = torch.cat([s.returned for s in steps])  # (n, d)
    assert sent.dtype == torch.float32
    p = len(res.prompt_ids)
    # the prefill frame is the same computation as a teacher-forced run of the prompt: bit-identical
    assert torch.equal(steps[0].sent, teacher_forced(tiny, "head:2", res.prompt_ids))
    assert torch.equal(steps[0].returned, teacher_forced(tiny, "tail:2", res.prompt_ids))
    # one token at a time with a KV cache vs one pass: equal up to float rounding
    torch.testing.assert_close(sent, teacher_forced(tiny, "head:2", ids), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(back, teacher_forced(tiny, "tail:2", ids), rtol=1e-5, atol=1e-5)

    sets = wt.save(tmp_path / "wire", dtype="fp32")
    head, tail = sets["head"], sets["tail"]
    assert head.boundary == "head:2" and tail.boundary == "tail:2" and head.index["kind"] == "wire"
    assert np.array_equal(head.hidden(), sent.numpy()) and np.array_equal(tail.hidden(), back.numpy())
    assert head.token_ids().tolist() == ids and head.positions().tolist() == list(range(len(ids)))
    assert (head.array("parents") == -2).all() and (head.array("kept") == 1).all()
    (doc,) = list(head.documents())
    assert doc.doc_id == "session-0" and doc.text == tiny.tokenizer.decode(ids)
    assert doc.text.startswith(PROMPT) and doc.offsets[:p].tolist() == [[i, i + 1] for i in range(p)]
    assert len(head) == 12 and [c["chunk"] for c in head.chunks] == list(range(12))
    assert head.index["wire_dtype"] == "float32" and head.index["runtime_split"] == "2,2"


def test_tree_drafts_parents_and_rejected_nodes_are_recorded(tiny) -> None:
    sm = SplitModel(tiny, "2,2", wire_dtype="fp32")
    sent_by_head: list[torch.Tensor] = []
    hook = sm.head.register_forward_hook(lambda m, a, out: sent_by_head.append(out[0].clone()))
    prompt = sm.encode_prompt("Hello there")
    p = len(prompt)
    tree, parents = [10, 11, 12, 13], [-1, 0, 0, 1]  # root, two children, a grandchild under node 1
    keep = {"prefix": p, "accepted": [0, 1, 3]}
    with WireTap(sm) as wt:
        wt.document("tree-doc", "Hello there")
        sm.remote.open()
        hc, tc = sm.head.new_cache(), sm.tail.new_cache()
        sm.forward_step(hc, tc, prompt, list(range(p)))
        sm.forward_step(hc, tc, tree, [p, p + 1, p + 1, p + 2], parents)
        sm.forward_step(hc, tc, [14], [p + 3], None, keep)
        sm.remote.close()
    hook.remove()
    s0, s1, s2 = wt.steps
    assert s1.parents == parents and s1.positions == [p, p + 1, p + 1, p + 2] and s1.token_ids == tree
    assert s1.kept == [True, True, False, True]  # node 2 was rejected by the next frame's keep
    assert s2.keep == keep and s2.kept == [True] and s0.kept == [True] * p
    for step, out in zip(wt.steps, sent_by_head):
        assert torch.equal(step.sent, out)  # exactly the head's output, as sent
    committed = prompt + [10, 11, 13, 14]
    kept_rows = torch.cat([s0.sent, s1.sent[[0, 1, 3]], s2.sent])
    torch.testing.assert_close(kept_rows, teacher_forced(tiny, "head:2", committed), rtol=1e-5, atol=1e-5)

    head = wt.save(dtype="fp32", shard_tokens=4)["head"]
    assert len(head.index["shards"]) == 3  # prompt | tree | last step
    assert head.array("parents").tolist() == [-2] * p + parents + [-2]
    assert head.array("kept").tolist() == [1] * p + [1, 1, 0, 1] + [1]
    assert head.offsets()[p + 2].tolist() == [-1, -1]  # a rejected node has no place in the text
    (doc,) = list(head.documents())
    assert doc.doc_id == "tree-doc" and doc.text == tiny.tokenizer.decode(committed)
    assert head.chunks[2]["keep"] == keep


def test_taplink_is_transparent(tiny) -> None:
    plain = SplitModel(tiny, "2,2")
    ref = plain.generate(PROMPT, 8, stop_on_eos=False)
    sm = SplitModel(tiny, "2,2")
    inner = sm.link
    with WireTap(sm) as wt:
        res = sm.generate(PROMPT, 8, stop_on_eos=False)
    assert res.token_ids == ref.token_ids and res.bytes_sent == ref.bytes_sent
    assert wt.link.stats.bytes_sent == res.bytes_sent and inner.stats.round_trips >= wt.link.stats.round_trips
    assert wt.steps[0].sent.dtype == torch.float16  # the default fp16 wire is recorded as sent
    assert isinstance(wt.link, TapLink) and wt.link.service is inner.service  # other attributes pass through
    standalone = TapLink(InProcessLink(inner.service))
    assert standalone.steps == [] and standalone.labels is None


def test_record_generations_labels_pii_in_prompts(tiny) -> None:
    from datasets import Dataset

    text = "Call John Smith today."
    ds = Dataset.from_list([{"doc_id": "pii-1", "text": text,
                             "pii_spans": [{"start": 5, "end": 15, "type": "person"}]}])
    wt = record_generations(SplitModel(tiny, "2,2"), ds, 3, stop_on_eos=False)
    head = wt.save()["head"]
    (doc,) = list(head.documents())
    assert doc.doc_id == "pii-1" and doc.pii_spans == [{"start": 5, "end": 15, "type": "person"}]
    assert head.pii_types[0] == "person" and doc.pii_labels.tolist()[:16] == [0] * 5 + [1] * 10 + [0]
    assert doc.hidden.dtype == np.float16


def test_errors(tiny) -> None:
    sm = SplitModel(tiny, "2,2")
    with WireTap(sm) as wt:
        pass
    with pytest.raises(AttackError, match="recorded no forward frames"):
        wt.save()
    with pytest.raises(AttackError, match="no prompts"):
        record_generations(sm, [], 4)
