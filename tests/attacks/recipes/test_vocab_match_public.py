"""vocab-match takes public positions (chat template, added special tokens) as known instead of searching them."""

from __future__ import annotations

import numpy as np
import torch

from attacks.registry import make_attack
from attacks.tapdata import Taps
from attacks.taps import TruncatedForward


def _chat_taps(tiny, text: str, template_chars: int) -> Taps:
    enc = tiny.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = torch.tensor([enc["input_ids"]])
    with torch.no_grad():
        hidden = TruncatedForward(tiny.model, 2)(ids)[0].numpy()  # (T, d)
    doc = {"doc_id": "c0", "genre": "chat", "text": text, "pii_spans": [],
           "template_spans": [{"start": 0, "end": template_chars}]}
    return Taps(hidden, ids[0].numpy(), np.asarray([ids.shape[1]]), np.asarray([0]), [doc],
                np.asarray(enc["offset_mapping"], dtype=np.int32),
                {"boundary": "head:2", "depth": 2, "model_sha256": tiny.sha256})


def test_template_positions_are_taken_not_searched(tiny) -> None:
    taps = _chat_taps(tiny, "<|user|>hello there", 8)
    public = np.arange(taps.n_tokens) < 8  # byte-level tokenizer: one token per character
    opts = {"proposer": "none", "max_candidates": 1, "batch_sizes": [1], "grad_steps": 0}
    known = make_attack("vocab-match", model=tiny, **opts).fit(taps).invert(taps, k=1)
    assert (known.tokens[public] == taps.token_ids[public]).all()  # the template, known to the cloud
    assert known.info["mean_candidates"] == 1.0
    blind = make_attack("vocab-match", model=tiny, public_known=False, **opts).fit(taps).invert(taps, k=1)
    assert (blind.tokens[public] != taps.token_ids[public]).any()  # a 1-candidate search alone misses them
