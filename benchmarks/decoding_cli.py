"""``splitinfer bench decoding``: exactness, tau, ablation and modelled speed of every proposer (issue 4)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.prompt_sets import SPLITS
from splitinfer import atomic
from splitinfer.cli_flags import (
    ModelFlags,
    add_deprecated,
    add_model_args,
    finite_float,
    parse_options,
    split_options,
)
from splitinfer.errors import SplitInferError


def cmd_decoding(args) -> int:
    from benchmarks.bench_output import decoding_document, write
    from benchmarks.decoding import run_decoding_bench, save
    from benchmarks.decoding_report import format_report, plot, summarize, targets
    from benchmarks.schema import read_json

    out = Path(args.out)
    if args.report_only:
        results = read_json(args.report_only)
        if not (isinstance(results, dict) and "step_model" in results):
            raise SplitInferError(f"{args.report_only} is not a bench decoding run (no step_model); give the "
                                  "decoding.json that bench decoding wrote")
    else:
        from splitinfer.client import SplitModel

        drafters = heldout_drafters(args) if args.prompt_split else None  # a bad name fails before the model loads
        sm = SplitModel(ModelFlags.from_args(args).load(), args.split, wire_dtype="fp32")
        if args.prompt_split:
            from benchmarks.decoding_heldout import run_heldout_bench

            results = run_heldout_bench(sm, args.prompt_split, args.max_new_tokens, args.prompts_per_category,
                                        rtt_prompts=args.rtt_prompts, ablation=not args.no_ablation,
                                        tolerance=args.tolerance, drafters=drafters)
            save(results, out)
        else:
            results = run_decoding_bench(
                sm, max_new_tokens=args.max_new_tokens, prompts_per_category=args.prompts_per_category,
                ablation=not args.no_ablation, ablation_prompts=args.ablation_prompts,
                proposers=args.proposers.split(",") if args.proposers else None, tolerance=args.tolerance,
                draft_calibration=args.draft_calibration, draft_head=args.draft_head,
                feature_draft_options=feature_draft_options(args.decoding_option), humaneval=args.humaneval,
                subset_prompts=args.subset_prompts, refs_out=args.refs_out,
            )
            save(results, out)
    table = summarize(results)
    results["targets"] = targets(table, results)
    report = format_report(results)
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out / "report.txt", report + "\n")
    summary = {k: results[k] for k in ("config", "step_model", "cross_validation", "replay_checks", "targets",
                                       "wall_s") if k in results}
    atomic.write_json(out / "summary.json", {**summary, "table": table}, indent=1, sort_keys=True)
    write(decoding_document({**summary, "table": table}), out / "results.json")
    print(report)
    for p in plot(results, out):
        print(f"plot written to {p}")
    print(f"report, summary.json and plots written to {out} ({results.get('wall_s', 0) / 60:.1f} min run)")
    exact = [t for k, t in results["targets"].items() if k.startswith("exactness")]
    return 0 if all(t["met"] for t in exact) else 1  # non-zero when any output differs from sequential


def heldout_drafters(args) -> dict[str, dict]:
    """The model drafters ``--proposers`` adds to a held-out run (its other rows are fixed), with their options;
    a one-line error for any other name."""
    from benchmarks.decoding import MODEL_DRAFTERS

    names = [n.strip() for n in (args.proposers or "").split(",") if n.strip()]
    other = [n for n in names if n not in MODEL_DRAFTERS]
    if other:
        raise SplitInferError(f"--prompt-split runs fixed rows; --proposers there only adds model drafters "
                              f"({', '.join(MODEL_DRAFTERS)}), not {', '.join(other)}")
    opts = {"local-draft": {"calibration": args.draft_calibration},
            "feature-draft": {"draft_head": args.draft_head, **feature_draft_options(args.decoding_option)}}
    return {n: opts[n] for n in names}


def feature_draft_options(items: list[str]) -> dict:
    """``--decoding-option feature-draft.KEY=VALUE`` items -> feature-draft's options (the only component
    whose options this benchmark takes; it applies them alone and as a source of combined)."""
    plain, nested = split_options(parse_options(items, "--decoding-option", "feature-draft.shortlist=false"))
    other = sorted(set(nested) - {"feature-draft"}) + sorted(plain)
    if other:
        raise SplitInferError(f"bench decoding takes only feature-draft options (--decoding-option "
                              f"feature-draft.KEY=VALUE); got {', '.join(other)}")
    return nested.get("feature-draft", {})


def register(bsub) -> None:
    d = bsub.add_parser("decoding", help="speculative decoding: exactness, tau per category, ablation, modelled tok/s")
    add_model_args(d)
    d.add_argument("--max-new-tokens", type=int, default=200)
    d.add_argument("--prompts-per-category", type=int, default=None,
                   help="cap on prompts per category (default: all: 5 project prompts, 10 held-out test, 4 dev)")
    d.add_argument("--proposers", default=None,
                   help="comma list (default: sequential, the training-free proposers and combined; also "
                        "jacobi, lookahead, local-draft, feature-draft); with --prompt-split only local-draft "
                        "and/or feature-draft, each added alone and as a source of combined")
    d.add_argument("--humaneval", type=int, default=20,
                   help="also the first N HumanEval problems in chat form (reported, never tuned on; default "
                        "%(default)s; 0: none)")
    d.add_argument("--subset-prompts", type=int, default=1,
                   help="prompts per category on which ngram-pool, prompt-lookup, suffix and token-recycling run "
                        "for real (their tau on all prompts is replayed and checked against these runs); "
                        "a number >= the prompts per category runs them in full (default %(default)s)")
    d.add_argument("--prompt-split", choices=SPLITS, default=None,
                   help="run the held-out Spec-Bench-style prompt sets (benchmarks/prompt_sets.py) instead of the "
                        "project's 20 prompts: dev and test are what a retuning may use, test2 is what "
                        "to report (with --max-new-tokens 256, rows at 128 tokens are replayed from the same "
                        "outputs; --prompts-per-category caps each category)")
    d.add_argument("--rtt-prompts", type=int, default=1,
                   help="held-out runs: prompts per category run for real over an emulated 80 ms link, sequential "
                        "and combined, for the measured speed-up (default %(default)s; 0: none)")
    d.add_argument("--refs-out", default=None, metavar="PATH",
                   help="also save the sequential outputs and top-k rows for replay tuning "
                        "(python -m benchmarks.decoding_tune --refs PATH)")
    d.add_argument("--no-ablation", action="store_true", help="skip the ablation sweeps")
    d.add_argument("--ablation-prompts", type=int, default=0,
                   help="prompts per category for the lookahead N sweep (real runs, with lookahead among "
                        "--proposers; default %(default)s: none)")
    d.add_argument("--tolerance", type=finite_float, default=1e-4, help="max |logit difference| (default %(default)s)")
    d.add_argument("--draft-calibration", default=None, metavar="PATH",
                   help="warm-start local-draft's bridge (see `splitinfer draft-calibrate`; default: online fit only)")
    d.add_argument("--draft-head", default=None, metavar="DIR",
                   help="feature-draft's trained head (see `splitinfer draft-train`; default: its cache directory)")
    d.add_argument("--decoding-option", action="append", default=[], metavar="feature-draft.KEY=VALUE",
                   help="an option of feature-draft, alone and as a source of combined (so one both take: "
                        "feature-draft.shortlist=false or feature-draft.draft_head=DIR; repeatable)")
    add_deprecated(d, "--feature-draft-option", "--decoding-option feature-draft.KEY=VALUE", "decoding_option",
                   append=True, convert=lambda item: [f"feature-draft.{item}"])
    d.add_argument("--out", default="reports/decoding", help="directory for decoding.json and plots")
    d.add_argument("--report-only", default=None, metavar="DECODING_JSON",
                   help="rebuild the report, summary.json and plots from an earlier run's decoding.json")
    d.set_defaults(func=cmd_decoding)
