"""The one tokenisation path: ids as the model's tokenizer gives them by default, one BOS, public positions."""

from __future__ import annotations

import numpy as np
import pytest

from splitinfer.corpora import template_token_mask
from splitinfer.errors import SplitInferError
from splitinfer.models import tiny_tokenizer
from splitinfer.tokens import (added_tokens, encode_chat, encode_text, encode_texts, leading_public, public_mask,
                               public_opening, public_prefix_length, tokenisation_record)

TEXTS = ["Hello world", "  two  spaces and a tab\t", "Fellow-Citizens of the Senate: 1813.", "é ü ß"]


def llama_style_tokenizer(*, eos: bool = False, template_bos: bool = True):
    """A byte-level BPE tokenizer whose post-processor puts ``<s>`` first (and ``</s>`` last with ``eos``), as
    Llama 2/3's, Mistral's and Gemma's do; its chat template writes the BOS itself or not (``template_bos``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for special in ("<s>", "<|user|>", "<|end|>", "</s>"):  # ids 256-259 (the tiny model's vocabulary has 259)
        vocab[special] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    single = "<s> $A </s>" if eos else "<s> $A"
    tk.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>",
                                  additional_special_tokens=["<|user|>", "<|end|>"])
    tok.chat_template = (("{{ bos_token }}" if template_bos else "")
                         + "{% for m in messages %}<|user|>{{ m['content'] }}<|end|>{% endfor %}"
                           "{% if add_generation_prompt %}<|user|>{% endif %}")
    return tok


@pytest.mark.parametrize("make", [tiny_tokenizer, llama_style_tokenizer], ids=["no-bos", "llama-style-bos"])
def test_ids_equal_the_tokenizers_own_default_encoding(make):
    """Before the fix every text was encoded with add_special_tokens=False: a BOS-adding tokenizer lost its BOS."""
    tok = make()
    for text in TEXTS:
        assert encode_text(tok, text).ids == tok(text)["input_ids"], text
    assert [e.ids for e in encode_texts(tok, TEXTS)] == [tok(t)["input_ids"] for t in TEXTS]


def test_an_appended_eos_is_dropped_and_the_bos_kept():
    tok = llama_style_tokenizer(eos=True)
    bos, eos = tok.bos_token_id, tok.eos_token_id
    assert added_tokens(tok) == ([bos], [eos])
    enc = encode_text(tok, "Hi")
    assert enc.ids == tok("Hi")["input_ids"][:-1] and enc.ids[0] == bos and eos not in enc.ids


def test_offsets_point_into_the_text_and_the_bos_is_public():
    tok = llama_style_tokenizer()
    text = "Hello world"
    enc = encode_text(tok, text)
    assert enc.offsets[0] == (0, 0) and enc.public[0]
    assert not any(enc.public[1:])
    assert "".join(text[a:b] for a, b in enc.offsets[1:]) == text
    # documents without template spans: the added BOS is public, every text token is user text
    assert template_token_mask(enc.offsets, []).tolist() == [True] + [False] * (len(enc) - 1)
    assert public_mask(enc).tolist() == enc.public


def test_a_text_that_already_starts_with_the_bos_gets_no_second_one():
    tok = llama_style_tokenizer()
    enc = encode_text(tok, "<s>Hello")
    assert enc.ids.count(tok.bos_token_id) == 1 and enc.ids[0] == tok.bos_token_id and enc.public[0]


@pytest.mark.parametrize("template_bos", [True, False])
def test_a_chat_encoding_carries_exactly_one_bos(template_bos):
    """Whether or not the chat template writes the BOS, the conversation starts with exactly one."""
    tok = llama_style_tokenizer(template_bos=template_bos)
    enc = encode_chat(tok, [{"role": "user", "content": "hi there"}])
    assert enc.ids.count(tok.bos_token_id) == 1 and enc.ids[0] == tok.bos_token_id
    content = [tok.decode([t]) for t, p in zip(enc.ids, enc.public) if not p]
    assert "".join(content) == "hi there"  # every template and special position is public, the turn is not
    assert enc.ids[-1] == tok.convert_tokens_to_ids("<|user|>")  # the generation prompt


def test_the_tiny_models_chat_encoding_matches_transformers():
    tok = tiny_tokenizer()
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "?"}]
    want = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert encode_chat(tok, msgs).ids == list(want)


def test_chat_needs_a_template():
    tok = tiny_tokenizer()
    tok.chat_template = None
    with pytest.raises(SplitInferError, match="no chat template"):
        encode_chat(tok, [{"role": "user", "content": "hi"}])


def test_the_record_names_what_was_added():
    rec = tokenisation_record(llama_style_tokenizer())
    assert rec["special_tokens_added"] == ["<s>"] and rec["chat_template_sha256"]
    assert tokenisation_record(tiny_tokenizer())["special_tokens_added"] == []


def test_the_split_client_prompt_starts_with_the_bos(tiny):
    """A split client of a BOS-adding model sends its BOS (before the fix: none)."""
    from splitinfer.client import SplitModel
    from splitinfer.models import LoadedModel

    tok = llama_style_tokenizer()
    loaded = LoadedModel(tiny.model, tok, "tiny-bos", "", None)
    sm = SplitModel(loaded, "2,2")
    ids = sm.encode_prompt("hi")
    assert ids[0] == tok.bos_token_id and ids == tok("hi")["input_ids"]
    assert np.asarray(sm.encode_prompt("hi", chat=True)).tolist().count(tok.bos_token_id) == 1


def test_the_public_opening_is_what_every_conversation_starts_with():
    from splitinfer.models import tiny_tokenizer

    tok = tiny_tokenizer()
    opening = public_opening(tok)
    assert tok.decode(opening) == "<|im_start|>user\n"
    chat = encode_chat(tok, [{"role": "user", "content": "hi there"}])
    assert public_prefix_length(tok, chat.ids) == len(opening) == leading_public(chat.public)
    # its own system prompt: public only up to the prompt's text; plain text: nothing (no BOS added)
    system = encode_chat(tok, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert public_prefix_length(tok, system.ids) == 1
    assert public_prefix_length(tok, encode_text(tok, "user text").ids) == 0


def test_leading_public_stops_at_the_first_user_token():
    assert leading_public([True, True, False, True]) == 2
    assert leading_public([False, True]) == 0 and leading_public(None) == 0 and leading_public([True]) == 1
