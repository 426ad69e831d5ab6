"""Offline tuning of the training-free proposers by exact replay.

Developer note: issue 15 items 1-3.

Builds, once, a reference set: for every prompt (the project's 20 prompts by
category, plus HumanEval prompts as an external code set, *reported, never
tuned on*), the unsplit model's greedy output (transformers ``generate``,
KV-cached, ``max_new_tokens``), the model's top-``k`` next tokens after every
position (for ``token-recycling``, :func:`~splitinfer.decoding.replay.top_tokens_of`)
and transformers' prompt lookup on the same prompt (:mod:`benchmarks.decoding_peers`,
forwards counted). Then replays any proposer configuration against it
(:func:`~splitinfer.decoding.replay.replay`: exact tau, no model), one
instance per prompt set in order, as ``bench decoding`` runs them.

``python -m benchmarks.decoding_tune --refs FILE [--humaneval N] [--config LABEL=NAME:K=V,K=V ...]``;
without ``--config`` it replays :data:`SWEEP` (the per-source ablation and the tree budget).
``--step-model FILE`` (a ``summary.json`` or results document of ``bench decoding``, whose fitted step
costs it reads) adds each row's modelled tok/s at 80 ms, 100 Mbit/s, with those CPU costs and with flat
per-step compute: a larger tree raises tau and costs compute, so a choice is read on both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.decoding import CPU80, FLAT80, HF_PROMPT_LOOKUP
from benchmarks.decoding_peers import PROMPT_LOOKUP_TOKENS, prompt_lookup_runs
from benchmarks.prompts import PROMPTS, humaneval_prompts
from benchmarks.refs_file import load_refs, save_refs
from splitinfer.decoding.base import DecodingEnv, make_proposer
from splitinfer.decoding.replay import replay, top_tokens_of
from splitinfer.timing import StepTimeModel

TOPK = 8
NO_LA = {"lookahead": "off"}
HF_PL = HF_PROMPT_LOOKUP  # transformers' rule (ngram 2, k = 10, first match, cut at EOS), replayed
SWEEP = {  # label -> (proposer, options); replayed on the project's prompts
    "ngram-pool": ("ngram-pool", {}),
    "prompt-lookup": ("prompt-lookup", {}),
    "transformers prompt lookup rule (k=10)": ("prompt-lookup", HF_PL),
    "suffix": ("suffix", {}),
    "token-recycling": ("token-recycling", {}),
    "token-recycling static d6 (paper-like)": ("token-recycling", {"tree": "static", "max_depth": 6}),
    "token-recycling static d10": ("token-recycling", {"tree": "static", "max_depth": 10}),
    "token-recycling dynamic d6": ("token-recycling", {"max_depth": 6}),
    "token-recycling k4": ("token-recycling", {"k": 4}),
    "token-recycling k2": ("token-recycling", {"k": 2}),
    "token-recycling T16": ("token-recycling", {"draft_budget": 16}),
    "token-recycling T64": ("token-recycling", {"draft_budget": 64}),
    "combined (default)": ("combined", {**CPU80, **NO_LA}),
    "combined T16": ("combined", {**CPU80, **NO_LA, "draft_budget": 16}),
    "combined T64": ("combined", {**CPU80, **NO_LA, "draft_budget": 64}),
    "combined flat@80": ("combined", {**FLAT80, **NO_LA}),
    "combined -suffix": ("combined", {**CPU80, **NO_LA, "sources": "prompt-lookup,ngram-pool,token-recycling"}),
    "combined -prompt-lookup": ("combined", {**CPU80, **NO_LA, "sources": "suffix,ngram-pool,token-recycling"}),
    "combined -ngram-pool": ("combined", {**CPU80, **NO_LA, "sources": "suffix,prompt-lookup,token-recycling"}),
    "combined -token-recycling": ("combined", {**CPU80, **NO_LA, "sources": "suffix,prompt-lookup,ngram-pool"}),
}
REPORT_ONLY = ("ngram-pool", "prompt-lookup", "transformers prompt lookup rule (k=10)", "token-recycling",
               "combined (default)", "combined -token-recycling")  # also replayed on HumanEval (never tuned on)


@torch.no_grad()
def batched_greedy(model, prompts: list[list[int]], max_new_tokens: int, eos: set[int], pad: int) -> list[list[int]]:
    """Greedy continuations of all ``prompts`` in one left-padded ``generate`` batch (each cut after its EOS).

    Batching changes float rounding, so on a near-tie a continuation can differ from the unbatched one: these
    outputs are the replay's ground truth, not the sequential reference of ``bench decoding``.
    """
    dev = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=dev)  # (B, P)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=dev)  # (B, P)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=sorted(eos), pad_token_id=pad)[:, width:].tolist()  # (B, N)
    cut = []
    for row in out:
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        cut.append(row[:end])
    return cut


def build_refs(sm, humaneval: int, max_new_tokens: int, peers: bool = False, prompt_split: str | None = None) -> dict:
    """Greedy outputs and top-k rows for every prompt, and optionally transformers' prompt lookup on each
    (``prompt_split``: held-out splits of :mod:`benchmarks.prompt_sets`, comma-separated, e.g. ``dev,test``,
    instead of the project's prompts; each category pools the splits' prompts)."""
    from benchmarks.prompt_sets import encode
    from benchmarks.prompt_sets import prompt_set
    from splitinfer.client import eos_ids

    model, eos = sm.loaded.model, eos_ids(sm.loaded)
    if prompt_split:
        sets = {s: [(cat, p) for cat, ps in prompt_set(s).items() for p in ps] for s in prompt_split.split(",")}
    else:
        sets = {"project": [(cat, p) for cat, ps in PROMPTS.items() for p in ps]}
    if humaneval and not prompt_split:
        sets["humaneval"] = [("humaneval", p) for p in humaneval_prompts(humaneval)]
    refs = []
    for name, items in sets.items():
        ids = [sm.encode_prompt(p, chat=True) if isinstance(p, str) else encode(sm.loaded.tokenizer, p)
               for _, p in items]
        t0 = time.perf_counter()
        outs = batched_greedy(model, ids, max_new_tokens, eos, sorted(eos)[0])
        print(f"{name}: {len(ids)} greedy generations in {time.perf_counter() - t0:.0f} s", flush=True)
        for (cat, _), p, out in zip(items, ids, outs):
            ref = {"category": cat, "ids": p, "output": out, "topk": top_tokens_of(model, p, out, TOPK)}
            if peers:
                ref["prompt_lookup"] = prompt_lookup_runs(model, [p], [out], max_new_tokens, eos)[0]
            refs.append(ref)
    return {"max_new_tokens": max_new_tokens, "eos": sorted(eos), "vocab_size": int(model.config.vocab_size),
            "model_sha256": sm.loaded.sha256, "refs": refs}


def replay_config(data: dict, name: str, options: dict, categories: set[str], tokenizer=None,
                  step_model: StepTimeModel | None = None) -> dict[str, list[tuple]]:
    """(tokens, round trips) per prompt, by category, of one proposer instance replayed over the prompts (in order;
    ``tokenizer``: the model's, for the datastore of ``rest`` and ``suffix-automaton``); with ``step_model``
    (projected to a network) each tuple also holds the prompt's modelled ms with its costs and with flat compute."""
    env = DecodingEnv(vocab_size=data["vocab_size"], eos_ids=frozenset(data["eos"]),
                      max_new_tokens=data["max_new_tokens"], tokenizer=tokenizer)
    proposer = make_proposer(name, **options)
    out: dict[str, list[float]] = {}
    for r in data["refs"]:
        if r["category"] in categories:
            steps = replay(proposer, r["ids"], r["output"], data["max_new_tokens"], env, topk=r["topk"])
            row = (sum(s.tokens_committed for s in steps), len(steps))
            if step_model is not None:
                row += (step_model.total_ms(steps), step_model.total_ms(steps, flat=True))
            out.setdefault(r["category"], []).append(row)
    return out


def table_row(per_cat: dict[str, list[tuple[int, int]]], cats: list[str]) -> dict[str, float]:
    """tau per category pooled as ``bench decoding`` pools it (tokens / round trips over its prompts; a mean of
    per-prompt tau would weight a short, well-drafted answer like a long one), and the mean of the categories."""
    row = {c: sum(p[0] for p in per_cat[c]) / sum(p[1] for p in per_cat[c]) for c in cats if c in per_cat}
    main = [v for c, v in row.items() if c != "humaneval"]
    row["mean"] = statistics.mean(main) if main else float("nan")
    timed = [c for c in cats if c != "humaneval" and c in per_cat and all(len(p) == 4 for p in per_cat[c])]
    for key, at in (("tok_s_cpu80", 2), ("tok_s_flat80", 3)):  # mean over categories of pooled tok/s
        if timed:
            row[key] = statistics.mean(1e3 * sum(p[0] for p in per_cat[c]) / sum(p[at] for p in per_cat[c])
                                       for c in timed)
    return row


def peer_row(data: dict, cats: list[str]) -> dict[str, float]:
    per: dict[str, list[tuple[int, int]]] = {}
    for r in data["refs"]:
        per.setdefault(r["category"], []).append((r["prompt_lookup"]["tokens"], r["prompt_lookup"]["forwards"]))
    return table_row(per, cats)


def format_table(rows: dict[str, dict[str, float]], cats: list[str]) -> str:
    cols = [*cats, "mean", *(k for k in ("tok_s_cpu80", "tok_s_flat80") if any(k in r for r in rows.values()))]
    width = max(len(k) for k in rows)
    lines = [f"{'decoding':<{width}}  " + "  ".join(f"{c[:12]:>12}" for c in cols)]
    for label, row in rows.items():
        lines.append(f"{label:<{width}}  " + "  ".join(f"{row.get(c, float('nan')):12.2f}" for c in cols))
    return "\n".join(lines)


def targets(rows: dict[str, dict[str, float]]) -> list[str]:
    """Issue 15's tau targets for the default combined, from the replayed rows (when present)."""
    c, g = rows.get("combined (default)"), rows.get("ngram-pool")
    p = rows.get("transformers prompt lookup rule (k=10)")
    if not (c and g and p):
        return []
    checks = [("tau / ngram-pool tau (mean of the 4 categories)", c["mean"] / g["mean"], 1.6),
              ("tau on code", c["code"], 2.5),
              ("tau / transformers prompt lookup tau, code", c["code"] / p["code"], 1.8),
              ("tau / transformers prompt lookup tau, mean", c["mean"] / p["mean"], 1.5)]
    if "humaneval" in c and "humaneval" in p:
        checks.append(("(report only) tau / transformers prompt lookup tau, HumanEval", c["humaneval"] / p["humaneval"],
                       1.8))
    return [f"combined (default): {what}: {v:.2f} (target {goal}) -> {'MET' if v >= goal else 'NOT MET'}"
            for what, v, goal in checks]


def load_step_model(path: Path) -> StepTimeModel:
    """The fitted step costs recorded by ``bench decoding`` (its ``summary.json``, or ``data`` of its results)."""
    try:
        doc = json.loads(path.read_text())
        fitted = doc.get("step_model") or doc["data"]["step_model"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"--step-model {path}: no fitted step costs there ({e}); give bench decoding's summary.json")
    return StepTimeModel.from_dict(fitted)


def _parse_config(text: str) -> tuple[str, tuple[str, dict]]:
    label, _, spec = text.partition("=")
    name, _, opts = spec.partition(":")
    options = {}
    for kv in filter(None, opts.split(",")):
        k, _, v = kv.partition("=")
        try:
            options[k] = json.loads(v)
        except json.JSONDecodeError:
            options[k] = v.replace(";", ",")  # list values inside a config: sources=a;b
    return label, (name, options)


def _splits(text: str) -> str:
    """``--prompt-split``: known split names, comma-separated; test2 refused (it is never tuned on)."""
    from benchmarks.prompt_sets import SPLITS, TUNING_SPLITS

    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SPLITS]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"unknown split {', '.join(bad) or repr(text)}; use {', '.join(SPLITS)}")
    held = [s for s in names if s not in TUNING_SPLITS]
    if held:
        raise argparse.ArgumentTypeError(f"{', '.join(held)} is held out: tune on {','.join(TUNING_SPLITS)} and "
                                         f"report it with bench decoding --prompt-split {held[0]}")
    return ",".join(names)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refs", required=True, help="reference file (built when missing)")
    ap.add_argument("--humaneval", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=200)
    ap.add_argument("--config", action="append", default=[],
                    help="LABEL=NAME:K=V,K=V (list values with ;; the label holds no '=')")
    ap.add_argument("--json", default=None, help="write the table here")
    ap.add_argument("--peers", action="store_true", help="also run transformers' prompt lookup on every prompt (slow)")
    ap.add_argument("--prompt-split", type=_splits, default=None,
                    help="build the references from held-out splits, comma-separated (tune on dev,test; "
                         "test2 is reported by bench decoding and never tuned on)")
    ap.add_argument("--step-model", default=None,
                    help="bench decoding's summary.json / results.json: add modelled tok/s at 80 ms (its costs, flat)")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    path = Path(args.refs)
    if not path.exists():
        from splitinfer.client import SplitModel
        from splitinfer.models import load_model

        sm = SplitModel(load_model("default"), "2,2", wire_dtype="fp32")
        save_refs(build_refs(sm, args.humaneval, args.max_new_tokens, args.peers, args.prompt_split), path)
    data = load_refs(path)
    cats = list(dict.fromkeys(r["category"] for r in data["refs"]))  # project prompts or a held-out split
    from splitinfer.models import load_model

    tokenizer = load_model("default").tokenizer
    configs = dict(_parse_config(c) for c in args.config) or SWEEP
    step_model = load_step_model(Path(args.step_model)).project(80.0, 100.0) if args.step_model else None
    have_peers = all("prompt_lookup" in r for r in data["refs"])
    rows = {f"transformers prompt lookup (k={PROMPT_LOOKUP_TOKENS})": peer_row(data, cats)} if have_peers else {}
    for label, (name, options) in configs.items():
        use = set(cats) if (args.config or label in REPORT_ONLY) else set(cats) - {"humaneval"}
        t0 = time.perf_counter()
        rows[label] = table_row(replay_config(data, name, options, use, tokenizer, step_model), cats)
        print(f"{label}: {rows[label]} ({time.perf_counter() - t0:.0f} s)", flush=True)
    print(format_table(rows, cats))
    for line in targets(rows):
        print(line)
    if have_peers:
        same = sum(r["prompt_lookup"]["token_identical"] for r in data["refs"])
        print(f"transformers prompt lookup identical to greedy: {same}/{len(data['refs'])}; assisted generation: n/a")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    from splitinfer.errors import SplitInferError

    try:
        raise SystemExit(main())
    except SplitInferError as e:  # a bad --config names itself in one line
        raise SystemExit(f"decoding_tune: error: {e}") from None
