"""Replaying a proposer against a known greedy output, without running the model.

Under greedy decoding the verifier accepts a draft node exactly when its
parent is accepted and its token equals the model's greedy token there; on
the accepted path those greedy tokens *are* the sequential output. So, given
the sequential output of a prompt, the accepted path of any draft is the
longest draft path that agrees with that output, and tokens per step (tau)
of a proposer can be computed without the model, step by step exactly as
:func:`splitinfer.decoding.verify.decode` would (same pruning, same
feedback for accepted nodes). Proposers that learn from the model's outputs
at *rejected* nodes (Jacobi iteration, lookahead's window) or draft with
the local model itself (``local-draft``, ``needs_model``) cannot be
replayed: :func:`replay` refuses them.

Used by the ablation benchmark to sweep many settings cheaply; the benchmark
also checks that replayed tau equals measured tau for the default proposers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from splitinfer.decoding.base import EMPTY, DecodingEnv, Proposer, StepFeedback
from splitinfer.decoding.tree import depths
from splitinfer.decoding.verify import prune_draft
from splitinfer.errors import SplitInferError
from splitinfer.timing import StepTimeModel, StepTiming, transfer_ms

def _timing(model: StepTimeModel | None, sent: int) -> StepTiming:
    t = StepTiming(tokens_sent=sent)
    if model is not None:
        nbytes = max(0.0, model.bytes[0] + model.bytes[1] * sent)
        t.bytes_up = t.bytes_down = int(nbytes / 2)
        t.network_ms = model.rtt_ms + transfer_ms(nbytes, model.bandwidth_mbps)
        t.total_ms = model.predict(sent)
        t.other_ms = t.total_ms - t.network_ms
    return t


def replay(
    proposer: Proposer,
    prompt: Sequence[int],
    output: Sequence[int],
    max_new_tokens: int,
    env: DecodingEnv,
    cost_model: StepTimeModel | None = None,
    topk: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> list[StepTiming]:
    """Steps (tokens sent / drafted / accepted / committed) the verifier would take to emit ``output``.

    ``output`` is the sequential greedy output for ``prompt`` under
    ``max_new_tokens`` (ending at EOS or at the budget). ``cost_model``, if
    given, fills in modelled times (proposers that size drafts by measured
    step time see them as feedback). ``topk`` (ids, probabilities), both
    (len(prompt) + len(output), k), are the model's top next tokens after
    every position of ``prompt + output`` (:func:`top_tokens_of`): they fill
    :attr:`StepFeedback.topk_ids` for the rows the replay knows (the
    prefill, the root and the accepted nodes; rejected nodes get -1).
    """
    if proposer.learns_from_rejected:
        raise SplitInferError(f"proposer {proposer.name!r} learns from the model's outputs and cannot be replayed")
    if proposer.needs_model:
        raise SplitInferError(f"proposer {proposer.name!r} drafts with the local model and cannot be replayed without "
                              "it; measure it with real runs (for combined drop local-draft from its sources)")
    if not output:
        raise SplitInferError("cannot replay an empty output")
    prompt, output = list(prompt), list(output)
    proposer.begin(list(prompt), env)
    steps = [_verified_step(proposer, prompt, output, max_new_tokens, cost_model, topk, prefill=True)]
    n_out = steps[0].tokens_committed
    context = prompt + output[:n_out]
    while n_out < len(output):
        steps.append(_verified_step(proposer, context, output[n_out:], max_new_tokens - n_out, cost_model, topk))
        context += output[n_out : n_out + steps[-1].tokens_committed]
        n_out += steps[-1].tokens_committed
    proposer.end(prompt, output)
    return steps


def _verified_step(proposer: Proposer, context: list[int], truth: list[int], remaining: int,
                   cost_model: StepTimeModel | None, topk: tuple[torch.Tensor, torch.Tensor] | None,
                   prefill: bool = False) -> StepTiming:
    """One step of the verifier, replayed: draft after ``context``, accept the longest path that agrees with
    ``truth`` (the greedy tokens after ``context``), hand the proposer its feedback; the step's timing.

    ``prefill``: ``context`` is the prompt and the step sends all of it, with a draft only for a proposer that
    drafts at prefill (transformers verifies one in the prefill forward; the split runtime never does);
    otherwise the step sends ``context[-1]`` and the draft.
    """
    drafts = remaining > 1 and (proposer.drafts_at_prefill or not prefill)
    draft = proposer.propose(list(context)) if drafts else EMPTY
    pruned, kept = prune_draft(draft, max_depth=remaining - 1, max_nodes=1 << 30)
    dep = depths(list(pruned.parents))
    ok: list[bool] = []
    best, best_depth = -1, 0
    for i, (tok, p) in enumerate(zip(pruned.tokens, pruned.parents)):
        good = (p < 0 or ok[p]) and dep[i] < len(truth) and tok == truth[dep[i]]
        ok.append(good)
        if good and dep[i] + 1 > best_depth:
            best, best_depth = i, dep[i] + 1
    path = []
    while best >= 0:
        path.append(best)
        best = pruned.parents[best]
    path.reverse()
    out = truth[: len(path) + 1]
    node_argmax: list[int | None] = [None] * len(draft)
    for i in path:
        if dep[i] + 1 < len(truth):
            node_argmax[kept[i]] = truth[dep[i] + 1]
    root_rows = list(range(len(context))) if prefill else [len(context) - 1]  # the rows sent before the draft
    t = _timing(cost_model, len(root_rows) + len(pruned))
    t.draft_tokens, t.draft_accepted, t.tokens_committed = len(pruned), len(path), len(out)
    fb = StepFeedback(draft, node_argmax, [kept[i] for i in path], truth[0], t, list(kept))
    if topk is not None:  # rows: the root(s), then the sent nodes; known for the root(s) and the accepted path
        rows = root_rows + [-1] * len(pruned)
        for i in path:
            rows[len(root_rows) + i] = len(context) + dep[i]
        fb.topk_ids, fb.topk_probs = _known_rows(topk, rows)
    proposer.update(list(context), list(out), fb)
    if proposer.learns_from_rejected:  # e.g. combined once its lookahead branch rode along
        raise SplitInferError(f"proposer {proposer.name!r} used the model's outputs; it cannot be replayed "
                              "(for combined pass lookahead='off')")
    return t


def _known_rows(topk: tuple[torch.Tensor, torch.Tensor], rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``rows`` of (ids, probs); a row -1 (unknown) gets ids -1 and probabilities 0."""
    ids, probs = topk
    idx = torch.tensor([max(0, r) for r in rows], dtype=torch.long)
    unknown = torch.tensor([r < 0 for r in rows])[:, None]  # (T, 1)
    return ids[idx].masked_fill(unknown, -1), probs[idx].masked_fill(unknown, 0.0)


@torch.no_grad()
def top_tokens_of(model, prompt: Sequence[int], output: Sequence[int], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The unsplit ``model``'s top-``k`` next tokens (and probabilities) after every position of prompt + output.

    One causal forward over the whole sequence; (ids, probs), both (len(prompt) + len(output), k), on the CPU.
    """
    from splitinfer.decoding.verify import top_tokens

    dev = next(model.parameters()).device
    logits = model(torch.tensor([list(prompt) + list(output)], device=dev)).logits[0]  # (P + N, V)
    return top_tokens(logits, k)


def tau(steps: Sequence[StepTiming]) -> float:
    """Tokens per round trip, prefill included (as ``GenerationResult.tokens_per_step``)."""
    return sum(s.tokens_committed for s in steps) / max(1, len(steps))
