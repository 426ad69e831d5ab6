"""Chat documents: conversation formatting, the template's character spans, and the ``chat`` corpus.

A chat document's text is the conversation as the model sees it (the model's
chat template when a tokenizer is given). Everything the template adds (system
prompt, role markers, separators) is recorded as ``template_spans``: character
ranges of the document text that are not turn content. :func:`template_token_mask`
turns them into a per-token mask, so metrics can score user text (turn content)
and template tokens apart: a template's fixed tokens are guessable from their
position alone and must not count as recovered text.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from splitinfer.corpora.dedup import normalise_text
from splitinfer.corpora.registry import CorpusError, CorpusPlan, dist_version, lookup, make_doc, package_dir, register_corpus

log = logging.getLogger(__name__)


def _as_messages(turns: Sequence[Any]) -> list[dict[str, str]]:
    messages = []
    for i, turn in enumerate(turns):
        if isinstance(turn, Mapping):
            if "role" not in turn or "content" not in turn:
                raise CorpusError(f"chat turn {i} {dict(turn)!r} needs 'role' and 'content' keys")
            messages.append({"role": str(turn["role"]), "content": str(turn["content"])})
        else:
            messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": str(turn).strip()})
    return messages


def format_chat_spans(turns: Sequence[Any], tokenizer: Any = None,
                      add_generation_prompt: bool = False) -> tuple[str, list[dict[str, int]]]:
    """``(text, template_spans)``: the formatted conversation and the character ranges the format added.

    With ``add_generation_prompt`` the text ends with the template's cue for the assistant's answer (a prompt
    to generate from); without it, it is a stored conversation (a corpus document).

    Turn contents are located in order in the formatted text; everything
    between them (and before the first, after the last) is template. A
    template that rewrites a turn's content so that it cannot be found raises
    :class:`CorpusError`.
    """
    messages = _as_messages(turns)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        cue = {"add_generation_prompt": True} if add_generation_prompt else {}
        text = tokenizer.apply_chat_template(messages, tokenize=False, **cue)
        if not isinstance(text, str):
            raise CorpusError(f"tokenizer.apply_chat_template returned {type(text).__name__}, expected str; pass a text tokenizer")
    else:
        if tokenizer is not None:
            log.info("tokenizer %s has no chat template; using the plain User/Assistant format", getattr(tokenizer, "name_or_path", "?"))
        text = "\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in messages)
        text += "\nAssistant:" if add_generation_prompt else ""
    spans, cursor = [], 0
    for m in messages:
        content = m["content"].strip()
        if not content:
            continue
        at = text.find(content, cursor)
        if at < 0:
            raise CorpusError(f"the chat template rewrote the turn {content[:40]!r} so it cannot be located in the "
                              "formatted text; use a template that keeps turn contents verbatim")
        if at > cursor:
            spans.append({"start": cursor, "end": at})
        cursor = at + len(content)
    if cursor < len(text):
        spans.append({"start": cursor, "end": len(text)})
    return text, spans


def format_chat(turns: Sequence[Any], tokenizer: Any = None) -> str:
    """Format a conversation as text.

    ``turns`` is a list of strings (alternating user / assistant, user first)
    or of ``{"role", "content"}`` dicts. With a tokenizer that has a chat
    template, the result is ``tokenizer.apply_chat_template(messages,
    tokenize=False)``; otherwise plain ``"User: ...\\nAssistant: ..."`` lines.
    """
    return format_chat_spans(turns, tokenizer)[0]


def template_token_mask(offsets: Any, template_spans: Sequence[Mapping[str, int]]) -> np.ndarray:
    """(T,) bool: True for tokens that hold no turn-content character (template and added special tokens).

    ``offsets`` is the (T, 2) character range of each token. A token touching
    any content character is user text; with no template spans every token is
    user text except those of no width: tokens the tokenizer added (a BOS at
    offsets (0, 0), :mod:`splitinfer.tokens`), which hold no text and are public.
    """
    off = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)  # (T, 2)
    if not template_spans:
        return off[:, 1] <= off[:, 0]
    end = int(max(off[:, 1].max(initial=0), max(s["end"] for s in template_spans)))
    content = np.ones(end + 1, dtype=bool)  # per character
    for s in template_spans:
        content[s["start"]: s["end"]] = False
    cum = np.concatenate([[0], np.cumsum(content)])  # content characters before each index
    return (cum[off[:, 1]] - cum[off[:, 0]]) == 0


def chat_format_id(tokenizer: Any) -> dict[str, Any]:
    """What identifies the chat format in a manifest: plain, or the template's sha256."""
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    if not template:
        return {"chat_format": "plain"}
    digest = hashlib.sha256(json.dumps(template, sort_keys=True, default=str).encode()).hexdigest()
    return {"chat_format": "template", "tokenizer": str(getattr(tokenizer, "name_or_path", "")), "chat_template_sha256": digest}


@register_corpus("chat", "chat", "chatterbot-corpus English conversations as user/assistant turns "
                 "(the model's chat template when a tokenizer is given); no normalised user turn of a test "
                 "conversation occurs in training")
def _chat(arg: str | None, seed: int, tokenizer: Any) -> CorpusPlan:
    import yaml

    files = sorted((package_dir("chatterbot_corpus") / "data" / "english").glob("*.yml"))
    if not files:
        raise CorpusError("chatterbot-corpus has no english/*.yml files; reinstall it with `pip install --force-reinstall chatterbot-corpus`")
    version = dist_version("chatterbot-corpus")
    docs: dict[str, dict[str, Any]] = {}
    links: dict[str, list[str]] = {}
    for path in files:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for i, turns in enumerate(data.get("conversations") or []):
            if not turns:
                continue
            doc_id = f"chatterbot/{path.stem}/{i:04d}"
            text, spans = format_chat_spans(turns, tokenizer)
            docs[doc_id] = make_doc(doc_id, "chat", text, f"chatterbot-corpus {version}: english/{path.name}#{i}",
                                    template_spans=spans)
            links[doc_id] = [normalise_text(m["content"]) for m in _as_messages(turns) if m["role"] == "user"]
    return CorpusPlan(list(docs), lookup(docs), info={"chatterbot_corpus_version": version, **chat_format_id(tokenizer)},
                      links=links)
