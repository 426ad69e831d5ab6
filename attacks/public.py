"""Public token positions: what the cloud knows without seeing the user's text (DESIGN.md sections 4 and 5).

A position is public when its token is a special token the tokenizer added
(BOS and the like: offsets ``(0, 0)``, no character of the text, :mod:`splitinfer.tokens`)
or a chat-template token (system prompt, role markers): :func:`splitinfer.corpora.template_token_mask`
over the document's ``template_spans``, per sequence of the taps. Public positions are never scored as
user text; attackers may take them as known (the template and the tokenizer
are public).
"""

from __future__ import annotations

import numpy as np

from attacks.tapdata import Taps
from splitinfer.corpora import template_token_mask

__all__ = ["public_mask"]


def public_mask(taps: Taps) -> np.ndarray:
    """(N,) bool: True where ``taps``' token is public (added special token or chat-template token).

    Taps without character offsets have no known public positions (all False).
    """
    out = np.zeros(taps.n_tokens, dtype=bool)
    if taps.offsets is None:
        return out
    for s, rows in taps.sequences():
        off = taps.offsets[rows]  # (T, 2)
        spans = taps.documents[int(taps.seq_doc[s])].get("template_spans") or []
        out[rows] = template_token_mask(off, spans)  # template spans and zero-width (added) tokens
    return out
