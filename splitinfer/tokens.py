"""One tokenisation path: text and chat turns to token ids exactly as the model's tokenizer does by default.

Every corpus, prompt, calibration text and training text in splitinfer goes
through :func:`encode_text` or :func:`encode_chat`, so every figure sees the
model's input distribution. What the tokenizer adds by default in front of a
text (Llama 2/3's, Mistral's and Gemma's BOS; nothing for SmolLM2) is added;
what it appends (an EOS, for tokenizers built with ``add_eos_token``) is not:
a prompt goes on after its text. A chat conversation carries exactly one BOS,
whether or not the template writes it.

Each encoding also says which positions are **public** (DESIGN.md section 5):
tokens the tokenizer adds and special tokens such as chat-template markers are
known to the cloud without seeing any user text, so they are never scored as
recovered text and a defense may leave them untouched. Chat-template text that
is not a special token (role names, separators) is public too; corpora record
it as ``template_spans`` and :func:`public_mask` joins the two.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from splitinfer.errors import SplitInferError

__all__ = ["Encoded", "added_tokens", "encode_text", "encode_texts", "encode_chat", "public_mask",
           "leading_public", "public_opening", "public_prefix_length", "tokenisation_record"]

_PROBE = "a"
_TURN_PROBE = "Qxyzzy plugh"  # a user turn no chat template's own text contains


@dataclass(frozen=True)
class Encoded:
    """A tokenised text: ``ids`` (T,), ``offsets`` (T, 2) character ranges into the text ((0, 0) for tokens
    the tokenizer added) and ``public`` (T,): True where the cloud knows the token without seeing user text."""

    ids: list[int]
    offsets: list[tuple[int, int]]
    public: list[bool]

    def __len__(self) -> int:
        return len(self.ids)


@functools.lru_cache(maxsize=64)
def _added(tokenizer: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    plain = list(tokenizer(_PROBE, add_special_tokens=False)["input_ids"])
    full = list(tokenizer(_PROBE)["input_ids"])
    for i in range(len(full) - len(plain) + 1):
        if full[i: i + len(plain)] == plain:
            return tuple(full[:i]), tuple(full[i + len(plain):])
    raise SplitInferError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} changes a text's own tokens when "
                          "it adds special tokens; splitinfer cannot tell what it adds: use a tokenizer that only "
                          "adds tokens around the text")


def added_tokens(tokenizer: Any) -> tuple[list[int], list[int]]:
    """``(prefix, suffix)``: the token ids the tokenizer adds before and after a text by default.

    Gemma 3, Llama and Mistral tokenizers add a BOS (prefix ``[bos]``); SmolLM2's add nothing. splitinfer adds
    the prefix and never the suffix (an EOS would end the prompt)."""
    try:
        prefix, suffix = _added(tokenizer)
    except TypeError:  # an unhashable tokenizer: no cache
        prefix, suffix = _added.__wrapped__(tokenizer)
    return list(prefix), list(suffix)


def _special_ids(tokenizer: Any) -> frozenset[int]:
    return frozenset(int(i) for i in (getattr(tokenizer, "all_special_ids", None) or ()))


def _with_prefix(tokenizer: Any, ids: list[int], offsets: list[tuple[int, int]]) -> Encoded:
    prefix, _ = added_tokens(tokenizer)
    if prefix and ids[: len(prefix)] != prefix:  # a text that already starts with them (a chat template's BOS)
        ids, offsets = prefix + ids, [(0, 0)] * len(prefix) + offsets
    special = _special_ids(tokenizer)
    n_prefix = len(prefix) if ids[: len(prefix)] == prefix else 0
    public = [k < n_prefix or t in special for k, t in enumerate(ids)]
    return Encoded(ids, offsets, public)


def encode_texts(tokenizer: Any, texts: Sequence[str]) -> list[Encoded]:
    """:func:`encode_text` of each text, tokenised in one batch."""
    if not texts:
        return []
    want_offsets = bool(getattr(tokenizer, "is_fast", False))
    extra = {"return_offsets_mapping": True, "verbose": False} if want_offsets else {}
    enc = tokenizer(list(texts), add_special_tokens=False, **extra)
    out = []
    for k in range(len(texts)):
        ids = [int(t) for t in enc["input_ids"][k]]
        offs = ([(int(a), int(b)) for a, b in enc["offset_mapping"][k]] if want_offsets else [(0, 0)] * len(ids))
        out.append(_with_prefix(tokenizer, ids, offs))
    return out


def encode_text(tokenizer: Any, text: str) -> Encoded:
    """``text`` as the model's tokenizer encodes it by default (``tokenizer(text)``), less any appended EOS.

    A text that already starts with the tokenizer's prefix (a rendered chat template that writes its BOS) gets
    no second one. Offsets need a fast tokenizer; a slow one gives (0, 0) for every token."""
    return encode_texts(tokenizer, [text])[0]


def encode_chat(tokenizer: Any, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True) -> Encoded:
    """A conversation in the model's chat template, with exactly one BOS where the tokenizer adds one.

    Every token outside the turns' contents (role markers, separators, system prompt, the BOS) is public."""
    if not getattr(tokenizer, "chat_template", None):
        raise SplitInferError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; "
                              "use plain prompts (drop --chat)")
    from splitinfer.corpora.chat import format_chat_spans, template_token_mask

    text, spans = format_chat_spans(list(messages), tokenizer, add_generation_prompt=add_generation_prompt)
    enc = encode_text(tokenizer, text)
    template = template_token_mask(np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2), spans)  # (T,)
    return Encoded(enc.ids, enc.offsets, [bool(p or t) for p, t in zip(enc.public, template)])


def public_mask(enc: Encoded, template_spans: Sequence[Mapping[str, int]] = ()) -> np.ndarray:
    """(T,) bool: the encoding's public positions joined with the tokens of a document's ``template_spans``."""
    from splitinfer.corpora.chat import template_token_mask

    offs = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)  # (T, 2)
    return np.asarray(enc.public, dtype=bool) | template_token_mask(offs, template_spans)


def leading_public(public: Sequence[bool] | None) -> int:
    """How many positions of a sequence (from position 0) are public with every position before them.

    Only these states are computed from public tokens alone: attention is causal, so the state of a public token
    that comes after user text (a chat-template marker closing the user's turn) already mixes that text in, and a
    defense must treat it as user data. 0 for None."""
    n = 0
    for p in public or ():
        if not p:
            break
        n += 1
    return n


def _opening(tokenizer: Any) -> tuple[int, ...]:
    prefix, _ = added_tokens(tokenizer)
    if not getattr(tokenizer, "chat_template", None):
        return tuple(prefix)
    enc = encode_chat(tokenizer, [{"role": "user", "content": _TURN_PROBE}])
    return tuple(enc.ids[: leading_public(enc.public)])


_opening_cached = functools.lru_cache(maxsize=16)(_opening)


def public_opening(tokenizer: Any) -> list[int]:
    """The token ids every conversation with the model opens with before any user text: the tokenizer's added
    prefix and the chat template's opening of a first user turn (with the template's default system prompt,
    e.g. SmolLM2's); the added prefix alone for a tokenizer without a chat template."""
    try:
        return list(_opening_cached(tokenizer))
    except TypeError:  # an unhashable tokenizer: no cache
        return list(_opening(tokenizer))


def public_prefix_length(tokenizer: Any, ids: Sequence[int]) -> int:
    """How many leading ``ids`` the cloud knows without user text: their common prefix with
    :func:`public_opening`. What the runtime knows from token ids alone (it has no template spans); a sequence
    with its own system prompt shares the opening only up to that prompt's text, and a tokenisation that
    merges the template's last token into the user's first stops the prefix one token early (both err towards
    defending a state)."""
    n = 0
    for a, b in zip(ids, public_opening(tokenizer)):
        if int(a) != b:
            break
        n += 1
    return n


def tokenisation_record(tokenizer: Any) -> dict[str, Any]:
    """What a results document's config records of the tokenisation: the tokens added and the chat template."""
    prefix, suffix = added_tokens(tokenizer)
    template = getattr(tokenizer, "chat_template", None)
    return {
        "special_tokens_added": tokenizer.convert_ids_to_tokens(prefix) if prefix else [],
        "prefix_ids": prefix,
        "suffix_dropped": tokenizer.convert_ids_to_tokens(suffix) if suffix else [],
        "public_positions": "added special tokens, special tokens and chat-template spans",
        "chat_template_sha256": (hashlib.sha256(json.dumps(template, sort_keys=True, default=str).encode())
                                 .hexdigest() if template else None),
    }
