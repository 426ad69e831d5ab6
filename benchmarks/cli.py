"""``splitinfer bench ...``: suites (``run``, ``merge``, ``report``, ``compare``, ``ls``, ``validate``,
``regress``) and benchmarks.

Every single benchmark writes with ``--out`` the versioned results document of
:mod:`benchmarks.bench_output`, which ``bench regress`` reads like a suite's results.json.
"""

from __future__ import annotations

from pathlib import Path

from splitinfer.cli_flags import (
    ModelFlags,
    add_deprecated,
    add_link_args,
    add_max_new_tokens,
    add_model_args,
    add_wire_dtype,
    positive_int,
    positive_int_list,
    quiet_datasets,
    wire_list,
)
from splitinfer.errors import SplitInferError


def cmd_speed(args) -> int:
    from benchmarks.bench_output import emit, speed_document
    from benchmarks.speed import format_speed, run_speed
    from splitinfer.partition import SplitConfig

    loaded = ModelFlags.from_args(args).load()
    result = run_speed(
        loaded, SplitConfig.parse(args.split), list(args.rtt_ms), n_tokens=args.max_new_tokens,
        bandwidth_mbps=args.bandwidth_mbps, wire=args.wire_dtype, server_memory=not args.no_server_memory,
    )
    return emit(format_speed(result), lambda: speed_document(result), args.out)


def cmd_exactness(args) -> int:
    from benchmarks.bench_output import exactness_document, write
    from benchmarks.exactness import PROMPTS, SPLITS, format_exactness, run_exactness

    if args.prompts > len(PROMPTS):
        raise SplitInferError(f"--prompts {args.prompts}: there are {len(PROMPTS)} built-in prompts; "
                              f"give 1-{len(PROMPTS)}")
    model = ModelFlags.from_args(args)
    loaded = model.load()
    splits = args.splits.split(";") if args.splits else SPLITS
    rows = run_exactness(loaded, splits, PROMPTS[: args.prompts], n_tokens=args.max_new_tokens,
                         wires=tuple(args.wire_dtype))
    print(format_exactness(rows))
    if args.out:
        config = {"model": loaded.spec, "model_sha256": loaded.sha256, "splits": list(splits),
                  "prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "wire_dtype": list(args.wire_dtype)}
        write(exactness_document(rows, config), args.out)
    bad = [r for r in rows if r["wire"] == "fp32" and (not r["identical"] or r["max_logit_diff"] > 1e-4)]
    return 1 if bad else 0


def cmd_extract(args) -> int:
    from benchmarks.bench_output import emit, extract_document
    from benchmarks.extract_speed import format_extract_speed, run_extract_speed

    quiet_datasets()
    loaded = ModelFlags.from_args(args).load()
    result = run_extract_speed(loaded, args.depths, args.corpus, n_tokens=args.max_tokens,
                               max_length=args.max_length, batch_size=args.batch_size, repeats=args.repeats,
                               threads=args.threads)
    return emit(format_extract_speed(result), lambda: extract_document(result), args.out)


def cmd_run(args) -> int:
    from benchmarks.run import run_suite
    from benchmarks.shard import Shard
    from benchmarks.suite_names import checked_suite

    suite = checked_suite(args.suite)  # what `bench validate` says, before the model loads, not when a stage starts
    if args.device is not None:  # e.g. the full suite on a GPU machine without editing its .toml
        from dataclasses import replace

        from splitinfer.server_config import check_device

        check_device(args.device)
        suite = replace(suite, device=args.device)
    shard = Shard.parse(args.shard) if args.shard else Shard()
    out = args.out or (f"reports/{suite.name}" if shard.whole else f"reports/{suite.name}/shard-{shard.index}")
    path = run_suite(suite, out, stages=[s for s in args.stages.split(",") if s] if args.stages else None,
                     shard=shard)
    print(f"results written to {path}")
    print(f"report written to {Path(out) / 'report.md'}")
    return _failed_exit(path)


def _failed_exit(path) -> int:
    """1 (one line per failed component) when the run left components out, else 0."""
    import json
    import sys

    failed = json.loads(Path(path).read_text()).get("failed_components") or []
    for f in failed:
        print(f"splitinfer: error: {f['stage']}: {f['kind']} {f['name']!r} left out: {f['error']}", file=sys.stderr)
    return 1 if failed else 0


def cmd_report(args) -> int:
    from benchmarks.report import write_report
    from benchmarks.schema import load, results_path

    path = results_path(args.results)  # the results.json, or the run directory that holds it
    results = load(path)
    out = Path(args.out) if args.out else path.parent
    out.mkdir(parents=True, exist_ok=True)
    print(f"report written to {write_report(results, out)}")
    return 0


def cmd_compare(args) -> int:
    """Rows of two or more results documents (e.g. two model families) side by side -> one Markdown page."""
    from benchmarks.cross_model import write_comparison

    print(f"comparison written to {write_comparison(args.results, args.out)}")
    return 0


def cmd_ls(args) -> int:
    """The suites (with their stages and budgets) and the registered stages."""
    from benchmarks.stages import STAGES
    from benchmarks.suite import list_suites, load_suite

    print("suites:")
    for name in list_suites():
        suite = load_suite(name)
        stages = ", ".join(f"{s} ({'-' if suite.budget_s(s) is None else f'{suite.budget_s(s):g} s'})"
                           for s in STAGES if s in suite.stages)
        print(f"  {name:<8} {suite.model:<12} {stages}")
        print(f"  {'':<8} {suite.description}")
    print("stages (run in this order; keys of their suite table):")
    for stage in STAGES.values():
        from dataclasses import fields

        keys = ", ".join(f.name for f in fields(stage.config))
        print(f"  {stage.name:<15} {stage.summary}\n  {'':<15} keys: {keys}")
    from benchmarks.suite_names import component_lines

    print("\n".join(component_lines()))
    return 0


def cmd_validate(args) -> int:
    """Check suite files: every key known and typed right, every component name registered (built-in or plugin);
    one line per file or bad name, exit 2 when any is bad."""
    import sys

    from benchmarks.suite import load_suite
    from benchmarks.suite_names import check_names

    bad = 0
    for name in args.suite:
        try:
            suite = load_suite(name)  # keys and types; loads the suite's plugins
        except SplitInferError as e:
            print(f"splitinfer: error: {e}", file=sys.stderr)
            bad += 1
            continue
        unknown = check_names(suite)  # every attack, defense, corpus and decoding it names is registered
        for line in unknown:
            print(f"splitinfer: error: {line}", file=sys.stderr)
        if unknown:
            bad += 1
            continue
        budgets = [b for s in suite.stages if (b := suite.budget_s(s)) is not None]
        total = f"budgets sum to {sum(budgets):g} s" if budgets else "no budgets"
        n = len(suite.stages)
        print(f"{suite.path}: ok ({n} stage{'s' * (n != 1)}: {', '.join(suite.stages)}; {total})")
    return 2 if bad else 0


def register(sub) -> None:
    """Mount ``bench`` and its sub-commands on the ``splitinfer`` sub-command parser."""
    from benchmarks import regress
    from benchmarks.attacks_depth_cli import register as register_attacks_depth
    from benchmarks.baseline import register as register_baseline
    from benchmarks.decoding_cli import register as register_decoding
    from benchmarks.merge import register as register_merge
    from benchmarks.server_batching_cli import register as register_batching
    from benchmarks.transport_cli import register as register_transport

    bench = sub.add_parser("bench", help="benchmarks: suites, single benchmarks, regress")
    bsub = bench.add_subparsers(dest="bench_command", required=True)

    s = bsub.add_parser("speed", help="sequential split decoding tok/s vs the unsplit bound, per RTT")
    add_model_args(s)
    add_link_args(s, rtt_default="0,20,80", bandwidth_default=100.0, jitter=False)
    add_max_new_tokens(s, 64, "tokens generated per measurement")
    s.add_argument("--out", default=None, help="also write the results document (JSON) here")
    s.add_argument("--no-server-memory", action="store_true",
                   help="skip measuring the cloud side's memory on a real `splitinfer serve` process")
    s.set_defaults(func=cmd_speed)

    e = bsub.add_parser("exactness", help="split vs unsplit greedy generation: token identity and logit diff")
    add_model_args(e, split_default=None)
    e.add_argument("--splits", default=None, help="splits separated by ';' (default 1,1;2,2;4,4;8,8;2,8;12,12)")
    e.add_argument("--prompts", type=positive_int, default=8, help="number of built-in prompts (1-8)")
    add_max_new_tokens(e, 64, "tokens generated per prompt")
    add_wire_dtype(e, "fp32,fp16", many=True)
    add_deprecated(e, "--wire", "--wire-dtype", "wire_dtype", type=wire_list)
    e.add_argument("--out", default=None, help="also write the results document (JSON) here")
    e.set_defaults(func=cmd_exactness)

    r = bsub.add_parser("run", help="run a suite (ci, quick, full, paper or a .toml) -> results.json, report.md, plots")
    r.add_argument("--suite", default="quick")
    r.add_argument("--out", default=None, help="output directory (default reports/SUITE)")
    r.add_argument("--stages", default=None, help="comma-separated subset of the suite's stages")
    r.add_argument("--shard", default=None, metavar="I/N",
                   help="run every N-th grid cell (job) of the attacks and defenses stages, starting at I; the other "
                        "stages run in shard 0 only; join the shards with bench merge (default: the whole run)")
    r.add_argument("--device", default=None,
                   help="cpu | cuda | cuda:N: run the suite there instead of its own device (recorded in results; "
                        "shards of one run must share it: bench merge refuses a mix)")
    r.set_defaults(func=cmd_run)
    register_merge(bsub)
    register_baseline(bsub)
    p = bsub.add_parser("report", help="rebuild report.md and plots from a results.json")
    p.add_argument("--results", required=True, help="a results.json, or the run directory that holds it")
    p.add_argument("--out", default=None, help="directory (default: next to results.json)")
    p.set_defaults(func=cmd_report)
    c = bsub.add_parser("compare", help="attack and defense rows of 2+ results documents (e.g. two model families) "
                                        "side by side, with their intervals -> Markdown")
    c.add_argument("results", nargs="+", help="2+ results.json files (or their run directories)")
    c.add_argument("--out", default="reports/cross_model.md", help="Markdown file to write (default %(default)s)")
    c.set_defaults(func=cmd_compare)
    ls = bsub.add_parser("ls", help="list the suites, the stages they can run, the plugins and every component")
    ls.set_defaults(func=cmd_ls)
    v = bsub.add_parser("validate", help="check suite files (names or .toml paths): keys, types, budgets")
    v.add_argument("suite", nargs="+")
    v.set_defaults(func=cmd_validate)

    register_transport(bsub)
    register_decoding(bsub)
    register_batching(bsub)
    x = bsub.add_parser("extract", help="activation extraction tok/s vs a plain truncated forward, per depth")
    add_model_args(x, split_default=None)
    x.add_argument("--depths", type=positive_int_list, default=(1, 8, 16), help="head depths (default 1,8,16)")
    x.add_argument("--corpus", default="prose", help="corpus to extract (default %(default)s)")
    x.add_argument("--max-tokens", type=positive_int, default=8192,
                   help="corpus tokens per measurement (default %(default)s)")
    add_deprecated(x, "--tokens", "--max-tokens", "max_tokens", type=positive_int)
    x.add_argument("--max-length", type=positive_int, default=256)
    x.add_argument("--batch-size", type=positive_int, default=4)
    x.add_argument("--repeats", type=positive_int, default=2, help="alternating runs; the fastest counts")
    x.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's own)")
    x.add_argument("--out", default=None, help="also write the results document (JSON) here")
    x.set_defaults(func=cmd_extract)
    register_attacks_depth(bsub)

    g = bsub.add_parser("regress", help="compare a results document against a committed baseline")
    regress.add_arguments(g)
    g.set_defaults(func=regress.run)

