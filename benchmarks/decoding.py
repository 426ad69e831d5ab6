"""Decoding benchmark (issue 4): exactness, tokens per round trip and modelled speed of every proposer.

``splitinfer bench decoding`` runs, on the default model split 2,2 over an
in-process link with an fp32 wire:

1. *Acceptance*: sequential greedy decoding of every prompt
   (:mod:`benchmarks.prompts`, chat template, ``--max-new-tokens`` 200), then
   every proposer at its defaults on the same prompts; each output must be
   token-identical to sequential and every emitted token's logits within
   ``--tolerance`` (1e-4). The suffix and combined proposers keep their
   state across prompts (SuffixDecoding's cache of earlier outputs).
2. *Step-time model* (DESIGN.md section 6, :mod:`splitinfer.timing`),
   fitted to all measured decode steps and cross-validated, projected to
   20 and 80 ms RTT at 100 Mbit/s; also with a *flat* per-step compute cost
   (every step costs what a 1-token step costs, as on a GPU).
   ``combined`` sizes its trees with this model's costs at 80 ms (fixed
   coefficients, so the run is reproducible); ``combined gpu-flat@80ms``
   with the flat costs (which also switches its lookahead branch on).
   Proposers that draft with the local model (``local-draft``, and
   ``combined+local-draft``: combined with local-draft as a fourth source)
   run after the fit with the same 80 ms costs; their steps stay out of the
   fit (their drafting time does not grow with the tokens sent), and their
   modelled time adds each step's measured drafting time instead.
   ``draft_calibration`` warm-starts their bridge from a calibration file.
   ``feature-draft`` (and ``combined+feature-draft``) run the same way, with
   the head trained by ``splitinfer draft-train`` (``draft_head``, default:
   the cache directory it writes to).
3. *Ablation* (the seed's section 6.4 on our model): ``ngram-pool`` n = 3..7,
   ``prompt-lookup`` / ``suffix`` / ``combined`` at T in {8, 16, 32, 64}, and
   ``combined`` sized for other costs, by exact replay against the sequential
   outputs (:mod:`splitinfer.decoding.replay`; checked against the measured
   runs); ``lookahead`` N = 3..7 by real runs on ``--ablation-prompts``
   prompts per category (it learns from the model's outputs and cannot be
   replayed).

4. *Peers* (issue 15 item 3): transformers' prompt lookup
   (``prompt_lookup_num_tokens=10``) on the unsplit model, tau = new tokens /
   forward calls (:mod:`benchmarks.decoding_peers`), each output checked
   against the sequential one; assisted generation is n/a (no smaller model
   with the same tokenizer offline).

Tables go to stdout (:mod:`benchmarks.decoding_report`), figures and the
raw results to ``--out``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from tqdm import tqdm

from benchmarks.prompts import PROMPTS
from splitinfer import atomic, batch_invariant
from splitinfer.client import SplitModel, eos_ids
from splitinfer.decoding.base import DecodingEnv, list_proposers, make_proposer
from splitinfer.decoding.combined import DEFAULT_SOURCES
from splitinfer.decoding.replay import replay, top_tokens_of
from splitinfer.errors import SplitInferError
from splitinfer.timing import StepTimeModel, StepTiming, cross_validate, fit

log = logging.getLogger(__name__)

RTTS = (20.0, 80.0)
BANDWIDTH = 100.0
BUDGETS = (8, 16, 32, 64)
NGRAMS = (3, 4, 5, 6, 7)
HF_RULE = "prompt-lookup transformers-rule"  # our prompt-lookup with transformers' matching rule, replayed
HF_PROMPT_LOOKUP = {"ngram": 2, "draft_budget": 10, "occurrence": "first"}
TOPK = 8  # top tokens per replayed row (token-recycling's k at most)
TR_KS = (2, 4, 8)


def _run_record(res, ref, cat: str, needs_model: bool = False) -> dict:
    """One generation's figures, and its exactness against the sequential reference."""
    same = res.token_ids == ref.token_ids
    n = min(len(res.logits), len(ref.logits))
    diff = (torch.stack(res.logits[:n]) - torch.stack(ref.logits[:n])).abs().max().item() if n else 0.0
    return {
        "category": cat,
        "tokens": len(res.token_ids),
        "steps": [s.to_dict() for s in res.steps],
        "wall_s": res.wall_s,
        "token_identical": same,
        "max_logit_diff": diff,
        "needs_model": needs_model,  # drafts with the local model: its draft time is added, not fitted
    }


@torch.no_grad()
def noise_floor(model, prompt_ids: list[int], output: list[int], ref_logits: list[torch.Tensor], chunk: int = 16) -> float:
    """Max |logit difference| of the *unsplit* model fed ``output`` in ``chunk``-token forwards vs sequential.

    The float32 rounding floor for any multi-token verification: the same
    model, the same tokens, only the batching differs (transformers' own
    forward with its KV cache, no split, no tree).
    """
    from transformers import DynamicCache

    cache, seq, rows = DynamicCache(), list(prompt_ids) + list(output), []
    dev = next(model.parameters()).device
    rows.append(model(torch.tensor([prompt_ids], device=dev), cache=cache, use_cache=True).logits[0, -1:])
    for i in range(len(prompt_ids), len(seq) - 1, chunk):
        ids = torch.tensor([seq[i : min(i + chunk, len(seq) - 1)]], device=dev)
        rows.append(model(ids, cache=cache, use_cache=True).logits[0])  # (n, V)
    got = torch.cat(rows)[: len(output)].float().cpu()
    return (got - torch.stack(ref_logits[: len(output)]).cpu()).abs().max().item()


def _steps(records: list[dict], decode_only: bool = True) -> list[StepTiming]:
    """Steps for the step-time fit (runs of model-drafting proposers left out)."""
    out = []
    for r in records:
        if r.get("needs_model"):
            continue
        steps = [StepTiming(**s) for s in r["steps"]]
        out += steps[1:] if decode_only else steps
    return out


def cost_coefficients(model: StepTimeModel, flat: bool = False) -> tuple[float, float]:
    """(step_ms, token_ms) of ``t(T) = step_ms + token_ms * T`` from a fitted, projected model."""
    t0, t1 = model.predict(0, flat), model.predict(1, flat)
    return t0, t1 - t0


class DecodingBench:
    """State of one benchmark run; see the module docstring."""

    def __init__(self, sm: SplitModel, prompts: dict[str, list[str]], max_new_tokens: int, tolerance: float):
        self.sm, self.max_new, self.tol = sm, max_new_tokens, tolerance
        self.items = [(cat, p) for cat, ps in prompts.items() for p in ps]
        self.ids = [sm.encode_prompt(p, chat=True) for _, p in self.items]
        self.refs: list = []
        self.runs: dict[str, list[dict]] = {}  # label -> per-prompt records
        self.env = DecodingEnv(vocab_size=int(sm.loaded.model.config.vocab_size),
                               eos_ids=frozenset(eos_ids(sm.loaded)), max_new_tokens=max_new_tokens)

    def reference(self) -> None:
        self.sm.generate(self.ids[0], 4)  # warm-up
        for ids, (cat, _) in tqdm(list(zip(self.ids, self.items)), desc="sequential", leave=False):
            self.refs.append(self.sm.generate(ids, self.max_new, record_logits=True))
        self.runs["sequential"] = [_run_record(r, r, cat) for r, (cat, _) in zip(self.refs, self.items)]
        model = self.sm.loaded.model
        self.floor = [noise_floor(model, ids, r.token_ids, r.logits) for ids, r in zip(self.ids, self.refs)]
        self.topk = [top_tokens_of(model, ids, r.token_ids, TOPK) for ids, r in zip(self.ids, self.refs)]

    def measure(self, label: str, name: str, options: dict | None = None, subset: list[int] | None = None) -> None:
        """Real runs of one proposer (one instance across the prompts, in order)."""
        proposer = make_proposer(name, **(options or {}))
        records = []
        for i in tqdm(subset if subset is not None else range(len(self.items)), desc=label, leave=False):
            res = self.sm.generate(self.ids[i], self.max_new, record_logits=True, decoding=proposer)
            records.append(_run_record(res, self.refs[i], self.items[i][0], proposer.needs_model))
            if not records[-1]["token_identical"] or records[-1]["max_logit_diff"] > self.tol:
                log.warning("%s: exactness failure on prompt %d (identical=%s, max diff %.2e)", label, i,
                            records[-1]["token_identical"], records[-1]["max_logit_diff"])
        self.runs[label] = records

    def replayed(self, label: str, name: str, options: dict | None = None, cost: StepTimeModel | None = None) -> None:
        """Exact replay of one proposer against the sequential outputs (no model)."""
        proposer = make_proposer(name, **(options or {}))
        records = []
        for ids, ref, (cat, _), topk in zip(self.ids, self.refs, self.items, self.topk):
            steps = replay(proposer, ids, ref.token_ids, self.max_new, self.env, cost, topk)
            records.append({"category": cat, "tokens": len(ref.token_ids), "steps": [s.to_dict() for s in steps],
                            "wall_s": None, "token_identical": True, "max_logit_diff": None, "replayed": True})
        self.runs[label] = records


def _head_sha(sm: SplitModel, draft_head: str | None, wanted: list[str]) -> str | None:
    """sha256 of the feature-draft head the run used (None when feature-draft did not run)."""
    if "feature-draft" not in wanted:
        return None
    from splitinfer.decoding.feature_head import default_dir, weights_sha256

    return weights_sha256(draft_head or default_dir(sm.loaded.sha256))


def run_decoding_bench(
    sm: SplitModel,
    max_new_tokens: int = 200,
    prompts_per_category: int = 5,
    ablation: bool = True,
    ablation_prompts: int = 1,
    proposers: list[str] | None = None,
    tolerance: float = 1e-4,
    draft_calibration: str | None = None,
    draft_head: str | None = None,
    feature_draft_options: dict | None = None,
    peers: bool = True,
) -> dict:
    """Run the whole benchmark and return its results (see the module docstring)."""
    prompts = {c: ps[:prompts_per_category] for c, ps in PROMPTS.items()}
    wanted = proposers or list_proposers()
    if feature_draft_options and "feature-draft" in wanted:  # a bad option fails now, not after an hour
        make_proposer("feature-draft", **feature_draft_options)
        if "combined" in wanted:
            make_proposer("combined", sources="feature-draft", **feature_draft_options)
    bench = DecodingBench(sm, prompts, max_new_tokens, tolerance)
    t_start = time.perf_counter()
    bench.reference()
    results_peers = _peers(bench) if peers else {}
    names = [n for n in wanted if n not in ("sequential", "combined", "local-draft", "feature-draft")]
    for name in names:
        bench.measure(name, name)
    model = fit(_steps([r for recs in bench.runs.values() for r in recs]), 0.0, None, skip_prefill=False)
    cpu80 = model.project(80.0, BANDWIDTH)
    step_ms, token_ms = cost_coefficients(cpu80)
    combined_opts = {"step_ms": step_ms, "token_ms": token_ms}
    flat_ms = cost_coefficients(cpu80, flat=True)
    flat_opts = {"step_ms": flat_ms[0], "token_ms": flat_ms[1]}
    if "combined" in wanted:
        bench.measure("combined", "combined", combined_opts)
        bench.measure("combined gpu-flat@80ms", "combined", flat_opts)
    for drafter, opts in (("local-draft", {"calibration": draft_calibration}),
                          ("feature-draft", {"draft_head": draft_head, **(feature_draft_options or {})})):  # model drafters: alone and in combined
        if drafter in wanted:
            bench.measure(drafter, drafter, {**combined_opts, **opts})
            if "combined" in wanted:
                sources = f"{','.join(DEFAULT_SOURCES)},{drafter}"
                bench.measure(f"combined+{drafter}", "combined", {**combined_opts, **opts, "sources": sources})
    # Pool every measured step for the final model (combined's steps included).
    all_steps = _steps([r for recs in bench.runs.values() for r in recs])
    model = fit(all_steps, 0.0, None, skip_prefill=False)
    results = {
        "config": {"model": sm.loaded.spec, "model_sha256": sm.loaded.sha256, "split": str(sm.split),
                   "kernels": batch_invariant.kernels(sm.loaded.model),
                   "batch_invariant_padding": batch_invariant.padding(sm.loaded.model),
                   "device": str(sm.device),
                   "wire_dtype": "fp32", "max_new_tokens": max_new_tokens, "prompts": prompts,
                   "tolerance": tolerance, "combined_options": combined_opts, "draft_calibration": draft_calibration,
                   "draft_head": draft_head, "draft_head_sha256": _head_sha(sm, draft_head, wanted),
                   "feature_draft_options": feature_draft_options or {},
                   "combined_gpu_flat_options": flat_opts},
        "step_model": model.to_dict(),
        "cross_validation": cross_validate(all_steps, 0.0, None, skip_prefill=False),
        "replay_checks": {},
        "peers": results_peers,
        "noise_floor": {"chunk": 16, "per_prompt": bench.floor, "max": max(bench.floor)},
    }
    if peers:  # our replay of transformers' rule against its real runs: the same forwards, prompt by prompt?
        bench.replayed(HF_RULE, "prompt-lookup", HF_PROMPT_LOOKUP)
        real = next(v for v in results_peers.values() if isinstance(v, list))
        results["replay_checks"]["transformers prompt lookup rule"] = (
            [len(r["steps"]) for r in bench.runs[HF_RULE]] == [r["forwards"] for r in real])
    if ablation:
        _ablation(bench, model, ablation_prompts, results)
    results["runs"] = bench.runs
    results["wall_s"] = time.perf_counter() - t_start
    return results


def _peers(bench: DecodingBench) -> dict:
    """transformers' prompt lookup on the unsplit model, per prompt (tau = tokens / forwards; identity)."""
    from benchmarks.decoding_peers import ASSISTED, PROMPT_LOOKUP_TOKENS, prompt_lookup_runs

    recs = prompt_lookup_runs(bench.sm.loaded.model, bench.ids, [r.token_ids for r in bench.refs], bench.max_new,
                              eos_ids(bench.sm.loaded))
    for rec, (cat, _) in zip(recs, bench.items):
        rec["category"] = cat
    return {f"transformers prompt-lookup k={PROMPT_LOOKUP_TOKENS} (unsplit)": recs, "assisted generation": ASSISTED}


def _ablation(bench: DecodingBench, model: StepTimeModel, ablation_prompts: int, results: dict) -> None:
    checks = results["replay_checks"]
    for name, opts in (("ngram-pool", {}), ("prompt-lookup", {}), ("suffix", {}), ("token-recycling", {}),
                       ("combined", results["config"]["combined_options"])):
        if name in bench.runs:
            label = f"{name} (replay)"
            try:
                bench.replayed(label, name, opts)
            except SplitInferError as e:  # combined with its lookahead branch learns from the model
                checks[name] = f"not replayable: {e}"
                continue
            committed = lambda recs: [[s["tokens_committed"] for s in r["steps"]] for r in recs]  # noqa: E731
            checks[name] = committed(bench.runs[name]) == committed(bench.runs[label])
            del bench.runs[label]
    for n in NGRAMS:
        bench.replayed(f"ngram-pool n={n}", "ngram-pool", {"ngram": n})
    for t in BUDGETS:
        bench.replayed(f"prompt-lookup T={t}", "prompt-lookup", {"draft_budget": t})
        bench.replayed(f"suffix T={t}", "suffix", {"draft_budget": t})
        for k in TR_KS:
            bench.replayed(f"token-recycling k={k} T={t}", "token-recycling", {"k": k, "draft_budget": t})
        bench.replayed(f"combined T={t} fixed", "combined", {"draft_budget": t, "adaptive": False,
                                                             "lookahead": "off"})
    for rtt in RTTS:
        for flat in (False, True):
            proj = model.project(rtt, BANDWIDTH)
            step_ms, token_ms = cost_coefficients(proj, flat)
            label = f"combined-no-lookahead sized {'gpu-flat' if flat else 'cpu'}@{rtt:g}ms"
            bench.replayed(label, "combined", {"step_ms": step_ms, "token_ms": token_ms, "lookahead": "off"})
    subset = [i for c in PROMPTS for i in [j for j, (cat, _) in enumerate(bench.items) if cat == c][:ablation_prompts]]
    for n in NGRAMS if subset else ():  # --ablation-prompts 0: no lookahead sweep (not empty rows)
        bench.measure(f"lookahead N={n}", "lookahead", {"ngram": n}, subset=subset)


def save(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_json(out / "decoding.json", results, indent=1, sort_keys=True)
