"""Corpora: the text the attackers train and are scored on, and the runtime's draft training reads.

Text sources only (no model): :mod:`~splitinfer.corpora.registry` (builders
and plans), :mod:`~splitinfer.corpora.sources` (``prose``, ``code``, ``pii``,
``file:<path>``, ``hf:<dataset>...``), :mod:`~splitinfer.corpora.chat` (the
``chat`` corpus and template masks), :mod:`~splitinfer.corpora.pii_templates`
(synthetic PII documents), :mod:`~splitinfer.corpora.dedup` (normalised-text
de-duplication and splitting) and :mod:`~splitinfer.corpora.loading`
(caching and manifests). The optional ``wiki`` corpus of the design is not
implemented.
"""

from splitinfer.corpora import chat as _chat_builders  # noqa: F401  (registers ``chat``)
from splitinfer.corpora import sources as _source_builders  # noqa: F401  (registers the other corpora)
from splitinfer.corpora.chat import format_chat, format_chat_spans, template_token_mask
from splitinfer.corpora.dedup import DEFAULT_FRACTIONS, SPLITS, normalise_text, split_documents
from splitinfer.corpora.loading import SPLIT_CHOICES, cache_root, corpus_manifest, count_tokens, load_corpus
from splitinfer.corpora.registry import CorpusError, list_corpora, register_corpus

__all__ = ["CorpusError", "DEFAULT_FRACTIONS", "SPLITS", "SPLIT_CHOICES", "cache_root", "corpus_manifest",
           "count_tokens", "format_chat", "format_chat_spans", "list_corpora", "load_corpus", "normalise_text",
           "register_corpus", "split_documents", "template_token_mask"]
