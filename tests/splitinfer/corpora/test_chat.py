"""Chat template spans and the per-token template mask (issue 14 item 2)."""

from __future__ import annotations

import numpy as np
import pytest

from splitinfer.corpora import format_chat, format_chat_spans, load_corpus, template_token_mask


def _template_text(text: str, spans) -> str:
    return "".join(text[s["start"]:s["end"]] for s in spans)


def test_plain_format_spans_cover_exactly_the_role_labels() -> None:
    text, spans = format_chat_spans(["Hi", "Hello!", "Bye"])
    assert text == format_chat(["Hi", "Hello!", "Bye"]) == "User: Hi\nAssistant: Hello!\nUser: Bye"
    assert _template_text(text, spans) == "User: \nAssistant: \nUser: "


def test_model_template_spans_and_token_mask(tiny) -> None:
    text, spans = format_chat_spans(["Hi there", "Hello! How are you?"], tiny.tokenizer)
    content = "".join(c for i, c in enumerate(text) if not any(s["start"] <= i < s["end"] for s in spans))
    assert content == "Hi thereHello! How are you?"
    enc = tiny.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = template_token_mask(enc["offset_mapping"], spans)  # (T,)
    user = tiny.tokenizer.decode([i for i, m in zip(enc["input_ids"], mask) if not m])
    assert user == "Hi thereHello! How are you?"
    assert mask[0] and mask[-1]  # <|im_start|> ... <|im_end|>\n


def test_mask_counts_a_token_touching_content_as_user_text() -> None:
    offsets = np.array([[0, 3], [3, 6], [6, 9], [9, 9]])
    assert template_token_mask(offsets, [{"start": 0, "end": 4}]).tolist() == [True, False, False, True]
    # a token of no width holds no text (a BOS the tokenizer added): public with or without template spans
    assert template_token_mask(offsets, []).tolist() == [False, False, False, True]


def test_chat_corpus_records_template_spans_others_none(tiny) -> None:
    chat = load_corpus("chat", "test", max_docs=5, tokenizer=tiny.tokenizer, cache=False)
    assert all(spans and spans[0]["start"] == 0 for spans in chat["template_spans"])
    prose = load_corpus("prose", "test", max_docs=2, cache=False)
    assert prose["template_spans"] == [[], []]


def test_template_that_rewrites_content_is_an_error() -> None:
    class Upper:
        chat_template = "x"
        name_or_path = "upper"

        def apply_chat_template(self, messages, tokenize=False):
            return "".join(m["content"].upper() for m in messages)

    with pytest.raises(Exception, match="cannot be located"):
        format_chat_spans(["hello", "there"], Upper())
