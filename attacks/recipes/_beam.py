"""Beam search over per-position candidates with a causal language-model prior (the decoder of ``lm-beam``).

:func:`beam_decode` finds, for each sequence, the token path maximising
``sum_t [ log p_attack(x_t) + lam * log p_LM(x_t | x_<t) ]`` over the
attacker's top-K candidates at each position, keeping ``beam`` partial paths
per sequence (exact Viterbi is impossible: the LM conditions on the whole
prefix). The LM is anything with the :class:`LMPrior` interface: ``start``
and ``step`` over R parallel rows (sequence x beam), each returning (R, V)
next-token log-probabilities; :class:`CausalLMPrior` runs a Hugging Face causal
LM incrementally with its KV cache, reordered to the surviving beams.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch


class LMPrior(Protocol):
    def start(self, rows: int) -> torch.Tensor:
        """(R,) rows at the start of their sequences -> (R, V) log p(x_0)."""

    def step(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Row r continues row ``parents[r]`` with ``tokens[r]`` -> (R, V) log p(next | its prefix)."""


class CausalLMPrior:
    """The public model as a next-token prior: one incremental forward per step, KV cache reordered by beam."""

    def __init__(self, model: Any, start_id: int | None):
        self.model = model  # a transformers *ForCausalLM in eval mode
        self.start_id = start_id  # token fed first (BOS); None: no prior on the first position
        self.cache: Any = None

    @torch.no_grad()
    def _forward(self, tokens: torch.Tensor) -> torch.Tensor:
        dev = next(self.model.parameters()).device
        out = self.model(input_ids=tokens[:, None].to(dev), cache=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return torch.log_softmax(out.logits[:, -1].float(), dim=-1).cpu()  # (R, V)

    @classmethod
    def for_text(cls, loaded: Any) -> CausalLMPrior:
        """The public model of ``loaded`` (a LoadedModel) as a prior over its tokenised text: it starts from the
        BOS (else the EOS) unless the tokenizer puts one in the text itself (the text then begins with it, and
        the prior on the first position is flat)."""
        from splitinfer.tokens import added_tokens

        tok = loaded.tokenizer
        prefix, _ = added_tokens(tok)
        start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        return cls(loaded.model, None if prefix else start)

    def start(self, rows: int) -> torch.Tensor:
        self.cache = None
        if self.start_id is None:
            return torch.zeros((rows, int(self.model.config.vocab_size)))  # flat: no prior on x_0
        return self._forward(torch.full((rows,), int(self.start_id), dtype=torch.long))

    def step(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        if self.cache is not None:
            self.cache.reorder_cache(parents.to(next(self.model.parameters()).device))
        return self._forward(tokens)


def beam_decode(cand_ids: np.ndarray, cand_logp: np.ndarray, lengths: np.ndarray, lm: LMPrior, lam: float,
                beam: int) -> np.ndarray:
    """Best path per sequence of attacker log-probs plus ``lam`` x LM log-probs; returns (S, T) token ids.

    cand_ids, cand_logp: (S, T, K) candidate ids and attacker log-probabilities (padding beyond ``lengths``
    ignored); lengths: (S,) tokens per sequence. Positions past a sequence's end return -1.
    """
    s_n, t_n, k_n = cand_ids.shape
    b_n = min(beam, k_n)
    ids = torch.from_numpy(np.asarray(cand_ids, dtype=np.int64))  # (S, T, K)
    att = torch.from_numpy(np.asarray(cand_logp, dtype=np.float32))  # (S, T, K)
    score = torch.full((s_n, b_n), float("-inf"))
    score[:, 0] = 0.0  # one live beam per sequence at the start
    lm_lp = lm.start(s_n * b_n).view(s_n, b_n, -1)  # (S, B, V)
    back_parent = np.zeros((t_n, s_n, b_n), dtype=np.int64)
    back_token = np.zeros((t_n, s_n, b_n), dtype=np.int64)
    rows = torch.arange(s_n)[:, None]
    for t in range(t_n):
        prior = torch.gather(lm_lp, 2, ids[:, t][:, None, :].expand(-1, b_n, -1))  # (S, B, K)
        total = score[:, :, None] + att[:, t][:, None, :] + lam * prior  # (S, B, K)
        best, flat = total.reshape(s_n, -1).topk(b_n, dim=1)  # (S, B)
        parent, k = flat // k_n, flat % k_n
        token = ids[:, t][rows, k]  # (S, B)
        live = torch.from_numpy(lengths > t)[:, None]  # (S, 1): finished sequences keep their beams
        parent = torch.where(live, parent, torch.arange(b_n)[None])
        token = torch.where(live, token, torch.from_numpy(back_token[t - 1]) if t else token)
        score = torch.where(live, best, score)
        back_parent[t], back_token[t] = parent.numpy(), token.numpy()
        if t + 1 < t_n:
            global_parent = (rows * b_n + parent).reshape(-1)  # (S*B,)
            lm_lp = lm.step(token.reshape(-1), global_parent).view(s_n, b_n, -1)
    out = np.full((s_n, t_n), -1, dtype=np.int64)
    for s in range(s_n):
        b = int(score[s].argmax())
        for t in range(int(lengths[s]) - 1, -1, -1):
            out[s, t] = back_token[t, s, b]
            b = back_parent[t, s, b]
    return out
