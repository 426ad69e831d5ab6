"""transformers' own speculative decoding beside ours: prompt lookup on the unsplit model, forwards counted.

Peers for ``splitinfer bench decoding`` (issue 15 item 3): ``generate`` with
``prompt_lookup_num_tokens`` (Saxena 2023, as in transformers) on the
*unsplit* model, greedy, KV-cached. Its tau is counted exactly as ours:
new tokens / model forward calls (a forward hook on the model; the prefill is
one call, as our prefill is one step). Assisted generation needs a smaller
model with the same tokenizer, and none is available offline for the default
model: it is reported as n/a.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

PROMPT_LOOKUP_TOKENS = 10  # the seed's setting (prompt_lookup_num_tokens=10)
ASSISTED = "n/a (no smaller model with the same tokenizer offline)"


@contextmanager
def count_forwards(model) -> Iterator[list[int]]:
    """Count the model's forward calls inside the block (``counter[0]``)."""
    counter = [0]

    def hook(_module, _args):
        counter[0] += 1

    handle = model.register_forward_pre_hook(hook)
    try:
        yield counter
    finally:
        handle.remove()


@torch.no_grad()
def hf_generate(model, prompt_ids: list[int], max_new_tokens: int, eos: set[int],
                prompt_lookup: int | None = None) -> tuple[list[int], int]:
    """Greedy ``model.generate`` (with ``prompt_lookup_num_tokens`` when given): (new tokens, forward calls).

    Stops at any of ``eos`` (included in the output, as our decoders include it) or after ``max_new_tokens``.
    """
    dev = next(model.parameters()).device
    ids = torch.tensor([prompt_ids], device=dev)  # (1, P)
    kwargs = {"prompt_lookup_num_tokens": prompt_lookup} if prompt_lookup else {}
    with count_forwards(model) as n:
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=sorted(eos), pad_token_id=sorted(eos)[0], **kwargs)
    return out[0, len(prompt_ids):].tolist(), n[0]


def prompt_lookup_runs(model, prompts: list[list[int]], references: list[list[int]], max_new_tokens: int,
                       eos: set[int]) -> list[dict]:
    """transformers' prompt lookup on every prompt: tokens, forwards, tau and identity with the greedy reference."""
    out = []
    for ids, ref in zip(prompts, references):
        toks, forwards = hf_generate(model, ids, max_new_tokens, eos, PROMPT_LOOKUP_TOKENS)
        out.append({"tokens": len(toks), "forwards": forwards, "tau": len(toks) / max(1, forwards),
                    "token_identical": toks == list(ref)})
    return out
