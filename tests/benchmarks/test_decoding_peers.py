"""transformers' prompt lookup, run for real on the tiny model, against the exact replay of its rule."""

import pytest
import torch

from benchmarks.decoding import HF_PROMPT_LOOKUP
from benchmarks.decoding_peers import PROMPT_LOOKUP_TOKENS, hf_generate
from splitinfer.client import eos_ids
from splitinfer.decoding.base import DecodingEnv, make_proposer
from splitinfer.decoding.replay import replay

N = 24


def _prompt_whose_answer_copies_the_prompt(model) -> list[int]:
    """A prompt ``A B c D E F A B`` whose greedy next token is ``c``: transformers' prompt lookup matches the final
    bigram ``A B`` at the start and drafts ``c D E F A B`` in the prefill forward, where ``c`` is accepted."""
    cs = torch.arange(3, int(model.config.vocab_size))  # (C,)
    for a in range(40, 60):
        for b in (41, 70, 90):
            batch = torch.tensor([[a, b, 0, 50, 51, 52, a, b]]).repeat(len(cs), 1)  # (C, 8)
            batch[:, 2] = cs
            with torch.no_grad():
                nxt = model(batch).logits[:, -1].argmax(-1)  # (C,)
            hits = (nxt == cs).nonzero().flatten().tolist()
            if hits:
                return batch[hits[0]].tolist()
    raise AssertionError("no prompt found whose greedy answer copies the prompt: widen the search")


def test_the_replay_of_transformers_rule_counts_its_prefill_draft(tiny):
    """transformers verifies a prompt-lookup draft in the prefill forward; a replay without it counted one forward
    too many on such a prompt (a held-out multi-turn prompt: 139 replayed steps against 138 real forwards)."""
    model, eos = tiny.model, eos_ids(tiny)
    prompt = _prompt_whose_answer_copies_the_prompt(model)
    greedy, _ = hf_generate(model, prompt, N, eos)
    tokens, forwards = hf_generate(model, prompt, N, eos, PROMPT_LOOKUP_TOKENS)
    assert tokens == greedy
    env = DecodingEnv(vocab_size=int(model.config.vocab_size), eos_ids=frozenset(eos), max_new_tokens=N)
    steps = replay(make_proposer("prompt-lookup", **HF_PROMPT_LOOKUP), prompt, greedy, N, env)
    assert steps[0].tokens_committed >= 2 and steps[0].draft_accepted >= 1
    assert sum(s.tokens_committed for s in steps) == len(greedy)
    assert len(steps) == forwards
    no_prefill = {**HF_PROMPT_LOOKUP, "at_prefill": False}
    assert len(replay(make_proposer("prompt-lookup", **no_prefill), prompt, greedy, N, env)) > forwards


@pytest.mark.parametrize("prompt", [[7, 8, 9, 10, 7, 8], [20, 21, 22, 23, 24], [5, 5, 5, 5]])
def test_the_replay_of_transformers_rule_matches_its_forwards(tiny, prompt):
    model, eos = tiny.model, eos_ids(tiny)
    greedy, _ = hf_generate(model, prompt, N, eos)
    tokens, forwards = hf_generate(model, prompt, N, eos, PROMPT_LOOKUP_TOKENS)
    assert tokens == greedy
    env = DecodingEnv(vocab_size=int(model.config.vocab_size), eos_ids=frozenset(eos), max_new_tokens=N)
    assert len(replay(make_proposer("prompt-lookup", **HF_PROMPT_LOOKUP), prompt, greedy, N, env)) == forwards
