"""Ablations of ``splitinfer bench decoding``, by exact replay against the sequential outputs (issues 4 and 15).

Every row here is replayed (:func:`splitinfer.decoding.replay.replay`; the
report marks it R), so it costs no model time and is exact for proposers
that learn only from committed tokens (the run checks replay == real run
step for step for every proposer it also runs for real):

- the seed's section 6.4: ``ngram-pool`` n = 3..7;
- draft budget T in {8, 16, 32, 64} for ``prompt-lookup``, ``suffix``,
  ``combined`` (fixed T, not adaptive) and Token Recycling (Luo et al. 2024)
  at k in {2, 4, 8} (the paper's adjacency-table width), plus its tree shape
  (the paper's static tree at depth 6 and 10 against our dynamic tree);
- the per-source ablation of the default ``combined`` (each training-free
  source left out in turn, each training-free source outside the defaults added, and each alone inside
  combined's merging);
- ``combined gpu-flat@80ms``: sized for ``FLAT80`` of :mod:`benchmarks.decoding` (lookahead branch off);
- ``combined`` sized for other step costs (this run's fitted CPU model and
  its flat, GPU-like variant, at 20 and 80 ms; lookahead branch off).

``lookahead`` N = 3..7 learns from the model's own Jacobi iterates and
cannot be replayed: it runs for real on ``ablation_prompts`` prompts per
category only when asked (``--ablation-prompts N`` with ``lookahead`` among
the proposers).
"""

from __future__ import annotations

from splitinfer.decoding.combined import DEFAULT_SOURCES, SOURCES
from splitinfer.timing import StepTimeModel

TRAINING_FREE = tuple(s for s in SOURCES if s not in ("local-draft", "feature-draft"))
BANDWIDTH_MBPS = 100.0  # the modelled link of the sizing rows

RTTS = (20.0, 80.0)
BUDGETS = (8, 16, 32, 64)
NGRAMS = (3, 4, 5, 6, 7)
TR_KS = (2, 4, 8)
TR_SHAPES = {"static d6 (paper-like)": {"tree": "static", "max_depth": 6},
             "static d10": {"tree": "static", "max_depth": 10}, "dynamic d6": {"max_depth": 6}}


def cost_coefficients(model: StepTimeModel, flat: bool = False) -> tuple[float, float]:
    """(step_ms, token_ms) of ``t(T) = step_ms + token_ms * T`` from a fitted, projected model."""
    t0, t1 = model.predict(0, flat), model.predict(1, flat)
    return t0, t1 - t0


def source_ablation(costs: dict) -> dict[str, dict]:
    """Labels and options of the default combined (sized with ``costs``) with each source left out, and alone."""
    out = {}
    for src in DEFAULT_SOURCES:
        rest = ",".join(s for s in DEFAULT_SOURCES if s != src)
        out[f"combined -{src}"] = {**costs, "sources": rest}
    for src in [s for s in TRAINING_FREE if s not in DEFAULT_SOURCES]:
        out[f"combined +{src}"] = {**costs, "sources": ",".join((*DEFAULT_SOURCES, src))}
    for src in TRAINING_FREE:
        out[f"combined only {src}"] = {**costs, "sources": src}
    return out


def run_ablation(bench, model: StepTimeModel, ablation_prompts: int, lookahead: bool, cpu80: dict,
                 flat80: dict, full: bool = True) -> None:
    """Add the ablation rows (see the module docstring) to ``bench.runs`` (a :class:`benchmarks.decoding.DecodingBench`;
    ``cpu80`` / ``flat80``: the default combined's fixed step costs and their flat variant; ``full`` False: only
    the per-source ablation and the flat-cost row, the held-out run's budget)."""
    for label, opts in source_ablation(cpu80).items():
        bench.replayed(label, "combined", opts)
    bench.replayed("combined gpu-flat@80ms", "combined", {**flat80, "lookahead": "off"})
    if not full:
        return
    for rtt in RTTS:
        for flat in (False, True):
            step_ms, token_ms = cost_coefficients(model.project(rtt, BANDWIDTH_MBPS), flat)
            label = f"combined-no-lookahead sized {'gpu-flat' if flat else 'cpu'}@{rtt:g}ms"
            bench.replayed(label, "combined", {"step_ms": step_ms, "token_ms": token_ms, "lookahead": "off"})
    for n in NGRAMS:
        bench.replayed(f"ngram-pool n={n}", "ngram-pool", {"ngram": n})
    for t in BUDGETS:
        bench.replayed(f"prompt-lookup T={t}", "prompt-lookup", {"draft_budget": t})
        bench.replayed(f"suffix T={t}", "suffix", {"draft_budget": t})
        for k in TR_KS:
            bench.replayed(f"token-recycling k={k} T={t}", "token-recycling", {"k": k, "draft_budget": t})
        bench.replayed(f"combined T={t} fixed", "combined", {"draft_budget": t, "adaptive": False,
                                                             "lookahead": "off"})
    for label, opts in TR_SHAPES.items():
        bench.replayed(f"token-recycling {label}", "token-recycling", opts)
    subset = bench.subset(ablation_prompts)
    for n in NGRAMS if lookahead and ablation_prompts else ():
        bench.measure(f"lookahead N={n}", "lookahead", {"ngram": n}, subset=subset)
