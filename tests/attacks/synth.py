"""Synthetic taps for fast attacker tests: easy, seeded, no model needed."""

from __future__ import annotations

import numpy as np

from attacks.tapdata import Taps

SHA = "0" * 64


def make_taps(n_seqs: int = 40, seq_len: int = 12, vocab: int = 40, d: int = 32, noise: float = 0.3, seed: int = 0,
              boundary: str = "head:2", sha: str = SHA, next_weight: float = 0.0, first_doc: int = 0,
              table_seed: int = 123, scale: float = 1.0) -> Taps:
    """Hidden state = table[token] (+ next_weight * table2[next token]) + noise; one document per sequence.

    The token tables depend on ``table_seed`` only, so train and test taps built with different ``seed`` share them.
    """
    tables = np.random.default_rng(table_seed)
    table, table2 = tables.normal(size=(vocab, d)), tables.normal(size=(vocab, d))
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(n_seqs, seq_len))  # (S, T)
    nxt = np.concatenate([ids[:, 1:], np.zeros((n_seqs, 1), dtype=ids.dtype)], axis=1)
    hidden = table[ids] + next_weight * table2[nxt] + noise * rng.normal(size=(n_seqs, seq_len, d))
    hidden = (scale * hidden).reshape(-1, d).astype(np.float32)
    docs = [{"doc_id": f"doc{first_doc + i}", "genre": "synthetic", "text": "", "pii_spans": []}
            for i in range(n_seqs)]
    meta = {"model": "synthetic", "model_sha256": sha, "boundary": boundary,
            "depth": int(boundary.split(":")[1]), "num_layers": 8, "hidden_size": d, "vocab_size": vocab}
    return Taps(hidden, ids.reshape(-1), np.full(n_seqs, seq_len), np.arange(n_seqs), docs, None, meta)


def accuracy(inv, taps: Taps) -> float:
    return float((inv.tokens == taps.token_ids).mean())


def embedding_taps(tiny, tokens: np.ndarray, seed: int, noise: float = 0.05) -> Taps:
    """Hidden = E[token] @ A + noise with a fixed random A: an easy linear inversion into the tiny model's embedding."""
    emb = tiny.model.model.embed_tokens.weight.detach().numpy()  # (V, d)
    a = np.random.default_rng(7).normal(size=(emb.shape[1], emb.shape[1])) / np.sqrt(emb.shape[1])
    rng = np.random.default_rng(seed)
    hidden = (emb[tokens] @ a + noise * rng.normal(size=(len(tokens), emb.shape[1]))).astype(np.float32)
    n_seq = len(tokens) // 10
    meta = {"model": tiny.spec, "model_sha256": tiny.sha256, "boundary": "head:2", "depth": 2, "num_layers": 6}
    docs = [{"doc_id": f"s{seed}-{i}", "genre": "", "text": "", "pii_spans": []} for i in range(n_seq)]
    return Taps(hidden, tokens, np.full(n_seq, 10), np.arange(n_seq), docs, None, meta)
