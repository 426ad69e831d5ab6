"""``splitinfer bench decoding --prompt-split dev|test|test2``: the held-out benchmark (issue 32 items 1-2).

:func:`run_heldout_bench`, on the held-out prompts of :mod:`benchmarks.prompt_sets` (chat template,
``--max-new-tokens`` 256, default split 2,2, fp32 wire, in-process link):

1. the default ``combined`` (sized for :data:`benchmarks.decoding.CPU80`) runs for real on every prompt, and
   each output is checked to be the greedy one token by token (:func:`greedy_reference`); these outputs are
   the references every other row is replayed against (exact: :mod:`splitinfer.decoding.replay`; marked R);
2. sequential runs for real on ``rtt_prompts`` prompts per category (same tokens as combined's?) and
   transformers' prompt lookup on the unsplit model on ``peer_prompts`` per category (its forwards must equal
   the replay of its rule, which then gives its tau on every prompt);
3. every source alone, the per-source ablation of combined (sources left out and added) and the sizing rows,
   all replayed; the same at 128 new tokens (rows ``@128``);
4. the speed-up over sequential at 80 ms: modelled (this CPU's fitted step costs and flat compute) and
   measured over an emulated 80 ms link on ``rtt_prompts`` prompts per category;
5. opt-in (``drafters``, ``--proposers feature-draft`` and/or ``local-draft``): each model drafter alone and as
   a source of ``combined``, run for real on every prompt (they read the model's states, so they cannot be
   replayed) and checked token by token against the references. Their draft time is local compute, added to
   the modelled step, not fitted.

Pieces:

- :func:`replay_short`: tau at a shorter generation length (128 tokens) by exact replay against the first
  tokens of the 256-token sequential outputs (greedy decoding's first 128 tokens *are* those).
- :func:`measured_at_rtt`: real runs of sequential and the default ``combined`` over the emulated link at
  80 ms on a few prompts per category, so the speed-up over sequential at 80 ms is measured as well as modelled.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import torch
from tqdm import tqdm

from splitinfer.decoding.replay import replay, top_tokens_of

log = logging.getLogger(__name__)

TOPK = 8  # top tokens per row for token-recycling's replay (as benchmarks.decoding)
SHORT = 128  # the shorter Spec-Bench-style generation length, replayed from the long references
SOURCES_ALONE = ("ngram-pool", "prompt-lookup", "suffix", "token-recycling", "rest", "suffix-automaton")


def replay_short(bench, label: str, name: str, options: dict | None, n: int = SHORT) -> None:
    """``label @n``: ``name`` replayed with a budget of ``n`` new tokens against the references' first ``n``."""
    records = []
    for i, proposer in bench.instances(name, options, list(range(len(bench.items)))):
        out = bench.refs[i].token_ids[:n]
        steps = replay(proposer, bench.ids[i], out, n, bench.env, None, bench.topk[i])
        records.append({"category": bench.items[i][0], "tokens": len(out), "steps": [s.to_dict() for s in steps],
                        "wall_s": None, "token_identical": True, "max_logit_diff": None, "replayed": True})
    bench.runs[f"{label} @{n}"] = records


def measured_at_rtt(bench, rtt_ms: float, per_category: int, max_new_tokens: int, combined_options: dict) -> dict:
    """Wall-clock tok/s of sequential and ``combined`` over a link emulating ``rtt_ms``, on the first
    ``per_category`` prompts of each category (``max_new_tokens`` each), and each output's identity with the
    sequential reference's first tokens."""
    from splitinfer.client import SplitModel
    from splitinfer.link import WanProfile

    sm = SplitModel(bench.sm.loaded, bench.sm.split, wan=WanProfile(rtt_ms=rtt_ms), wire_dtype="fp32")
    subset = bench.subset(per_category)
    out: dict = {"rtt_ms": rtt_ms, "max_new_tokens": max_new_tokens, "prompts": len(subset)}
    for label, name, opts in (("sequential", "sequential", None), ("combined", "combined", combined_options)):
        tokens = wall = steps = same = 0
        for i, proposer in tqdm(list(bench.instances(name, opts, subset)), desc=f"{label}@{rtt_ms:g}ms",
                                leave=False):
            res = sm.generate(bench.ids[i], max_new_tokens, decoding=proposer)
            tokens, wall, steps = tokens + len(res.token_ids), wall + res.wall_s, steps + len(res.steps)
            same += res.token_ids == bench.refs[i].token_ids[:max_new_tokens]
        out[label] = {"tokens": tokens, "wall_s": wall, "steps": steps, "tok_s": tokens / wall if wall else 0.0,
                      "tau": tokens / max(1, steps), "identical": same, "n": len(subset)}
    out["speedup"] = out["combined"]["tok_s"] / out["sequential"]["tok_s"] if out["sequential"]["tok_s"] else 0.0
    return out


@torch.no_grad()
def greedy_reference(bench, name: str, options: dict) -> None:
    """Run ``name`` for real on every prompt and make its outputs the references, each checked token by token.

    A generation is *greedy* when every token is the model's argmax after the tokens before it. Each output is
    checked so: one causal forward of the unsplit model over prompt + output (:func:`top_tokens_of`, whose top-k
    rows token-recycling's replay needs anyway) must put every output token first, and an output shorter than
    the budget must end at EOS. This stands in for a sequential run of every prompt (about twice the CPU time);
    sequential runs for real on a subset (``bench.measure``) and must give the same tokens. The teacher-forced
    forward differs from 1-token decoding by the float32 floor, so a near-tie can flag a correct output; none
    is hidden.
    """
    model = bench.sm.loaded.model
    records, bench.refs, bench.topk = [], [], []
    for i, proposer in tqdm(list(bench.instances(name, options, list(range(len(bench.items))))), desc=name,
                            leave=False):
        res = bench.sm.generate(bench.ids[i], bench.max_new, decoding=proposer)
        topk = top_tokens_of(model, bench.ids[i], res.token_ids, TOPK)
        rows = topk[0][len(bench.ids[i]) - 1 : len(bench.ids[i]) - 1 + len(res.token_ids), 0].tolist()
        wrong = sum(a != b for a, b in zip(rows, res.token_ids))
        ended = len(res.token_ids) >= bench.max_new or (res.token_ids and res.token_ids[-1] in bench.env.eos_ids)
        bench.refs.append(SimpleNamespace(token_ids=list(res.token_ids), logits=[]))
        bench.topk.append(topk)
        records.append({"category": bench.items[i][0], "tokens": len(res.token_ids),
                        "steps": [s.to_dict() for s in res.steps], "wall_s": res.wall_s,
                        "token_identical": wrong == 0 and bool(ended), "argmax_mismatches": wrong,
                        "max_logit_diff": None, "needs_model": False})
        if records[-1]["token_identical"] is False:
            log.warning("%s: prompt %d is not the greedy output (%d positions differ)", name, i, wrong)
    bench.runs[name] = records
    bench.floor = [0.0]


def _peer_records(bench, label: str) -> list[dict]:
    """transformers' prompt lookup over every prompt, from the exact replay of its rule: tokens and forwards."""
    return [{"category": r["category"], "tokens": r["tokens"], "forwards": len(r["steps"]),
             "tau": r["tokens"] / max(1, len(r["steps"])), "token_identical": True} for r in bench.runs[label]]


def run_heldout_bench(sm, split: str, max_new_tokens: int = 256, per_category: int | None = None,
                      rtt_prompts: int = 1, peer_prompts: int = 1, ablation: bool = True,
                      tolerance: float = 1e-4, drafters: dict[str, dict] | None = None) -> dict:
    """The held-out benchmark: see the module docstring of :mod:`benchmarks.decoding` and this module's.

    ``drafters``: model drafter name -> its options (e.g. ``{"feature-draft": {"draft_head": DIR}}``), each run
    alone and in ``combined`` (rows ``NAME`` and ``combined+NAME``)."""
    from benchmarks.decoding import CPU80, FLAT80, HF_PROMPT_LOOKUP, HF_RULE, DecodingBench, committed
    from benchmarks.decoding import head_sha, measured_steps
    from benchmarks.decoding_ablation import run_ablation
    from benchmarks.decoding_peers import prompt_lookup_runs
    from benchmarks.prompt_sets import prompt_set
    from splitinfer import batch_invariant
    from splitinfer.client import eos_ids
    from splitinfer.decoding.combined import DEFAULT_SOURCES
    from splitinfer.timing import cross_validate, fit
    from splitinfer.tokens import tokenisation_record

    t0 = time.perf_counter()
    drafters = drafters or {}
    prompts = prompt_set(split, per_category)
    bench = DecodingBench(sm, prompts, max_new_tokens, tolerance)
    sm.generate(bench.ids[0], 4)  # warm-up
    greedy_reference(bench, "combined", CPU80)
    subset = bench.subset(rtt_prompts) if rtt_prompts else []
    if subset:  # sequential for real: the same tokens as combined's, and the 1-token steps of the fit
        bench.measure(f"sequential (real, {rtt_prompts}/category)", "sequential", subset=subset)
    checks = {"combined": committed(bench.runs["combined"]) == committed(bench.replayed("", "combined", CPU80))}
    for name in ("sequential", *SOURCES_ALONE):
        bench.replayed(name, name)
    bench.replayed(HF_RULE, "prompt-lookup", HF_PROMPT_LOOKUP)
    peer_sub = bench.subset(peer_prompts) if peer_prompts else []
    real_peer = prompt_lookup_runs(sm.loaded.model, [bench.ids[i] for i in peer_sub],
                                   [bench.refs[i].token_ids for i in peer_sub], max_new_tokens, eos_ids(sm.loaded))
    checks["transformers prompt lookup rule"] = [r["forwards"] for r in real_peer] == [
        len(bench.runs[HF_RULE][i]["steps"]) for i in peer_sub]
    for drafter, opts in drafters.items():  # real runs: a model drafter reads states, no replay
        bench.measure(drafter, drafter, {**CPU80, **opts})
        bench.measure(f"combined+{drafter}", "combined",
                      {**CPU80, **opts, "sources": ",".join((*DEFAULT_SOURCES, drafter))})
    all_steps = measured_steps([r for recs in bench.runs.values() for r in recs])
    model = fit(all_steps, 0.0, None, skip_prefill=False)
    if ablation:
        run_ablation(bench, model, 0, False, CPU80, FLAT80, full=False)
    if max_new_tokens > SHORT:
        for name in ("sequential", *SOURCES_ALONE):
            replay_short(bench, name, name, None, SHORT)
        replay_short(bench, "combined", "combined", CPU80, SHORT)
        replay_short(bench, HF_RULE, "prompt-lookup", HF_PROMPT_LOOKUP, SHORT)
    peers = {"transformers prompt-lookup k=10 (unsplit; its rule replayed, checked on real runs)":
             _peer_records(bench, HF_RULE), "assisted generation": "n/a (no smaller model with the same tokenizer)"}
    for rec, i in zip(real_peer, peer_sub):
        rec["category"] = bench.items[i][0]
    results = {
        "config": {"model": sm.loaded.spec, "model_sha256": sm.loaded.sha256, "split": str(sm.split),
                   "kernels": batch_invariant.kernels(sm.loaded.model), "device": str(sm.device),
                   "wire_dtype": "fp32", "max_new_tokens": max_new_tokens, "prompt_split": split,
                   "prompts": prompts, "categories": list(prompts), "tolerance": tolerance,
                   "combined_options": CPU80, "combined_gpu_flat_options": FLAT80,
                   "combined_sources": list(DEFAULT_SOURCES), "reference": "combined, checked greedy token by token",
                   "drafters": drafters,
                   "draft_head_sha256": head_sha(sm, drafters.get("feature-draft", {}).get("draft_head"), drafters),
                   "real_sequential_prompts_per_category": rtt_prompts, "real_peer_prompts_per_category": peer_prompts,
                   "tokenisation": tokenisation_record(sm.loaded.tokenizer)},
        "step_model": model.to_dict(),
        "cross_validation": cross_validate(all_steps, 0.0, None, skip_prefill=False),
        "replay_checks": checks,
        "peers": peers,
        "peer_real_runs": real_peer,
        "runs": bench.runs,
    }
    if rtt_prompts:
        results["measured_rtt"] = measured_at_rtt(bench, 80.0, rtt_prompts, min(SHORT, max_new_tokens), CPU80)
    results["wall_s"] = time.perf_counter() - t0
    return results
