"""The verifier: the only code that runs the model (and so the cloud body) while decoding.

One step is one round trip (:meth:`SplitModel.forward_step`). It carries
the committed-next token (the root, node 0, already chosen from the previous
step's logits) plus the proposer's draft as a token tree: draft roots hang
under node 0 and every node sits at position ``base + depth`` with tree
attention (SpecInfer, Miao et al. 2024). From the returned logits:

- greedy (temperature 0): a node is accepted when its parent is and its
  token equals the argmax of the parent's logits; the deepest accepted node
  ends the path, and the argmax there is the *bonus* token. The emitted
  tokens are exactly those sequential greedy decoding would emit, so the
  output is token-identical (up to float rounding of the logits).
- sampling: the speculative-sampling rule (Leviathan et al. 2023; Chen et
  al. 2023) for deterministic drafts. For a child token ``d`` of the current
  node with target distribution ``p``, accept with probability ``p(d)``,
  else set ``p(d) = 0`` and renormalise (the residual ``norm(max(0, p -
  q))`` for a point-mass ``q``) and try the next child; when no child is
  accepted, sample the bonus from the residual. This keeps the model's
  output distribution exactly (SpecInfer's multi-candidate extension).

The accepted path is committed in all three KV caches by the ``keep`` of
the *next* step's frame (no extra round trip); when generation stops, the
local caches are trimmed the same way and the cloud session is closed by
the caller. Stopping follows sequential decoding exactly: tokens after EOS
or beyond ``max_new_tokens`` are never emitted, and the draft is pruned so
that no node could only produce tokens beyond ``max_new_tokens``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import torch

from splitinfer.decoding.base import EMPTY, DecodingEnv, Draft, LocalModules, Proposer, StepFeedback
from splitinfer.decoding.tree import depths, path_to
from splitinfer.timing import StepTiming

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- pure cores
def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The sampling distribution (V,) for one row of logits: temperature, then nucleus (top-p)."""
    probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)  # (V,)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cut = torch.cumsum(sorted_p, 0) - sorted_p >= top_p  # drop tokens once mass >= top_p is reached
        sorted_p[cut] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return probs


def sample(probs: torch.Tensor, gen: torch.Generator) -> int:
    """One draw from an (unnormalised) distribution (V,)."""
    return int(torch.multinomial(probs, 1, generator=gen))


def children_of(parents: Sequence[int]) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0:
            kids[p].append(i)
    return kids


def greedy_accept(tokens: Sequence[int], parents: Sequence[int], argmax: Sequence[int]) -> tuple[list[int], list[int]]:
    """Longest greedy-consistent path of a tree whose node 0 is the root.

    ``argmax[i]`` is the model's greedy token after node ``i``. Returns the
    accepted path (node indices from 0) and the emitted tokens (the accepted
    nodes' tokens after the root, then the bonus argmax at the path's end).
    """
    ok = [False] * len(tokens)
    ok[0] = True
    dep = depths(parents)
    best = 0
    for i in range(1, len(tokens)):
        p = parents[i]
        if ok[p] and tokens[i] == argmax[p]:
            ok[i] = True
            if dep[i] > dep[best]:
                best = i
    path = path_to(parents, best)
    return path, [tokens[i] for i in path[1:]] + [argmax[best]]


def speculative_accept(
    tokens: Sequence[int],
    parents: Sequence[int],
    probs_at: Callable[[int], torch.Tensor],
    gen: torch.Generator,
) -> tuple[list[int], list[int]]:
    """Speculative sampling down a tree of deterministic guesses (see the module docstring).

    ``probs_at(i)`` is the target distribution (V,) after node ``i``.
    Returns the visited path (from node 0) and the emitted tokens.
    """
    kids = children_of(parents)
    cur, path, out = 0, [0], []
    while True:
        p = probs_at(cur)  # (V,) unnormalised; with no guesses this samples exactly as sequential does
        nxt = None
        seen: set[int] = set()
        for c in kids[cur]:
            d = tokens[c]
            if d in seen:  # a duplicate guess has zero residual mass: it can never be accepted
                continue
            seen.add(d)
            total = float(p.sum())
            mass = float(p[d]) / total if total > 0 else 0.0
            if mass > 0 and float(torch.rand((), generator=gen)) < mass:
                nxt = c
                break
            if mass > 0:
                p = p.clone()
                p[d] = 0.0  # the residual: p without the rejected guess (renormalised by the next draw)
        if nxt is None:
            out.append(sample(p, gen))
            return path, out
        path.append(nxt)
        out.append(tokens[nxt])
        cur = nxt


def top_tokens(logits: torch.Tensor, k: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The ``k`` most probable next tokens of every row of ``logits`` (T, V) and their softmax probabilities.

    (None, None) when ``k`` is 0; both (T, k) on the CPU otherwise (ids long, probabilities fp32).
    """
    if k <= 0:
        return None, None
    probs, ids = torch.softmax(logits.float(), dim=-1).topk(min(k, logits.shape[-1]), dim=-1)  # (T, k)
    return ids.cpu(), probs.cpu()


def prune_draft(draft: Draft, max_depth: int, max_nodes: int) -> tuple[Draft, list[int]]:
    """Drop nodes deeper than ``max_depth`` (1 = child of the root) and beyond ``max_nodes``.

    Returns the pruned draft and, for each kept node, its index in ``draft``.
    Dropping a node drops its subtree; node order stays topological.
    """
    if not len(draft) or max_depth < 1 or max_nodes < 1:
        return EMPTY, []
    dep = depths(list(draft.parents))
    keep: list[int] = []
    new_index: dict[int, int] = {}
    for i, (p, d) in enumerate(zip(draft.parents, dep)):
        if d + 1 > max_depth or len(keep) >= max_nodes or (p >= 0 and p not in new_index):
            continue
        new_index[i] = len(keep)
        keep.append(i)
    if len(keep) == len(draft):
        return draft, keep
    return Draft(
        tuple(draft.tokens[i] for i in keep),
        tuple(-1 if draft.parents[i] < 0 else new_index[draft.parents[i]] for i in keep),
    ), keep


# ---------------------------------------------------------------------- the decode loop
@dataclass
class VerifiedStep:
    """Tokens one round trip emitted, the logits that chose them and its timing."""

    tokens: list[int]
    logits: torch.Tensor | None  # (n, V) fp32, row j chose tokens[j]; None unless recorded
    timing: StepTiming
    done: bool


def decode(
    sm,
    prompt_ids: list[int],
    proposer: Proposer,
    max_new_tokens: int,
    *,
    eos: set[int],
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    record_logits: bool = False,
    env: DecodingEnv | None = None,
) -> Iterator[VerifiedStep]:
    """Run prefill then verified steps on ``sm`` (a SplitModel with an open session); yield per step."""
    greedy = temperature == 0
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def choose(row: torch.Tensor) -> int:  # row: (V,)
        return int(torch.argmax(row)) if greedy else sample(sampling_probs(row, temperature, top_p), gen)

    env = env or DecodingEnv(vocab_size=int(sm.loaded.model.config.vocab_size), eos_ids=frozenset(eos),
                             max_new_tokens=max_new_tokens)
    if env.tokenizer is None:  # datastore sources tokenise public text with the model's tokenizer
        env = replace(env, tokenizer=sm.loaded.tokenizer)
    if env.local is None:  # lend the local parts to proposers that draft with the model (own caches only)
        env = replace(env, local=LocalModules(sm.head, sm.tail, sm.loaded.num_layers, sm.loaded.sha256 or ""))
    head_cache, tail_cache = sm.head.new_cache(), sm.tail.new_cache()
    t0 = time.perf_counter()
    proposer.begin(list(prompt_ids), env)
    begin_ms = 1e3 * (time.perf_counter() - t0)

    # Prefill: the prompt, plain causal; its last row picks the first token.
    logits, timing, states = sm.forward_step(head_cache, tail_cache, list(prompt_ids), list(range(len(prompt_ids))),
                                             return_states=True)
    t0 = time.perf_counter()
    first = choose(logits[-1])
    select_ms = 1e3 * (time.perf_counter() - t0)
    context = list(prompt_ids) + [first]
    n_out, done = 1, first in eos or max_new_tokens <= 1
    t0 = time.perf_counter()
    k_top = int(getattr(proposer, "feedback_topk", 0))
    proposer.update(list(prompt_ids), [first],
                    StepFeedback(EMPTY, [], [], int(torch.argmax(logits[-1])), timing, [], *states,
                                 *top_tokens(logits, k_top)))
    if done:
        proposer.end(list(prompt_ids), [first])
    _account(timing, begin_ms + 1e3 * (time.perf_counter() - t0), select_ms, 0, 0, 1)
    yield VerifiedStep([first], logits[-1:].clone() if record_logits else None, timing, done)
    base, keep = len(prompt_ids), None
    limit = sm.max_context or 1 << 30

    while not done:
        remaining = max_new_tokens - n_out
        t0 = time.perf_counter()
        draft = proposer.propose(list(context)) if remaining > 1 else EMPTY
        # A node at depth k can only emit tokens k and k+1 of this step: keep k + 1 <= remaining.
        # (stream() already checked prompt + max_new_tokens against the context limit.)
        pruned, kept = prune_draft(draft, max_depth=remaining - 1, max_nodes=limit - base - 1)
        draft_ms = 1e3 * (time.perf_counter() - t0)
        if len(pruned):
            parents = [-1] + [0 if p < 0 else p + 1 for p in pruned.parents]
            tokens = [context[-1], *pruned.tokens]
            positions = [base + d for d in depths(parents)]
        else:
            parents, tokens, positions = None, [context[-1]], [base]
        logits, timing, states = sm.forward_step(head_cache, tail_cache, tokens, positions, parents, keep,
                                                 return_states=True)  # (n, V), ((n, d),) * 3
        t0 = time.perf_counter()
        tree_parents = parents or [-1]
        argmax = logits.argmax(dim=-1).tolist()  # (n,)
        if greedy:
            path, emitted = greedy_accept(tokens, tree_parents, argmax)
        else:
            probs_at = lambda i: sampling_probs(logits[i], temperature, top_p)  # noqa: E731
            path, emitted = speculative_accept(tokens, tree_parents, probs_at, gen)
        out: list[int] = []
        for tok in emitted:
            out.append(tok)
            if tok in eos or n_out + len(out) >= max_new_tokens:
                done = True
                break
        select_ms = 1e3 * (time.perf_counter() - t0)
        rows = path[: len(out)]  # row j of the tree chose out[j]
        t0 = time.perf_counter()
        node_argmax: list[int | None] = [None] * len(draft)
        for new_i, old_i in enumerate(kept):
            node_argmax[old_i] = argmax[new_i + 1]
        # Accepted nodes whose tokens were emitted: past EOS or the budget the model may still agree,
        # but those tokens are not part of the output, so proposers must not learn from them.
        accepted_nodes = [kept[i - 1] for i in path[1 : len(out) + 1]]
        fb = StepFeedback(draft, node_argmax, accepted_nodes, argmax[0], timing, list(kept), *states,
                          *top_tokens(logits, k_top))
        proposer.update(list(context), list(out), fb)
        context += out
        n_out += len(out)
        if done:
            proposer.end(list(prompt_ids), context[len(prompt_ids):])
        n_draft = len(pruned)
        n_accepted = min(len(path) - 1, len(out))  # accepted draft tokens actually emitted
        _account(timing, draft_ms + 1e3 * (time.perf_counter() - t0), select_ms, n_draft, n_accepted, len(out))
        yield VerifiedStep(out, logits[rows].clone() if record_logits else None, timing, done)
        if done:
            # Leave the local caches holding exactly the committed context minus its last token,
            # as the body's would after the next frame's keep (the caller closes the session).
            head_cache.keep(base, rows)
            tail_cache.keep(base, rows)
            break
        keep = {"prefix": base, "accepted": path} if len(path) < len(tokens) else None
        base += len(path)


def _account(
    timing: StepTiming, draft_ms: float, select_ms: float, n_draft: int, n_accepted: int, n_committed: int
) -> None:
    """Add the proposer's time (draft_ms) and token selection (to tail_ms) to a step's timing."""
    timing.draft_ms += draft_ms
    timing.tail_ms += select_ms
    timing.total_ms += draft_ms + select_ms
    timing.draft_tokens = n_draft
    timing.draft_accepted = n_accepted
    timing.tokens_committed = n_committed
    timing.finish(timing.total_ms)
