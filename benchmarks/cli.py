"""``splitinfer bench ...``: speed benchmark and results regression check."""

from __future__ import annotations

from pathlib import Path

from splitinfer import atomic


def cmd_speed(args) -> int:
    from benchmarks.speed import format_speed, run_speed
    from splitinfer.cli import load_for_cli
    from splitinfer.partition import SplitConfig

    loaded = load_for_cli(args)
    rtts = [float(x) for x in args.rtt_ms.split(",")]
    result = run_speed(
        loaded, SplitConfig.parse(args.split), rtts, n_tokens=args.tokens,
        bandwidth_mbps=args.bandwidth_mbps, wire=args.wire_dtype, server_memory=not args.no_server_memory,
    )
    print(format_speed(result))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_json(out, result, indent=2, sort_keys=True)
        print(f"results written to {out}")
    return 0


def cmd_exactness(args) -> int:
    from benchmarks.exactness import PROMPTS, SPLITS, format_exactness, run_exactness
    from splitinfer.cli import load_for_cli

    loaded = load_for_cli(args)
    splits = args.splits.split(";") if args.splits else SPLITS
    rows = run_exactness(loaded, splits, PROMPTS[: args.prompts], n_tokens=args.tokens,
                         wires=tuple(args.wire.split(",")))
    print(format_exactness(rows))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_json(out, rows, indent=2)
        print(f"results written to {out}")
    bad = [r for r in rows if r["wire"] == "fp32" and (not r["identical"] or r["max_logit_diff"] > 1e-4)]
    return 1 if bad else 0


def register(sub) -> None:
    from splitinfer.cli import add_model_args

    bench = sub.add_parser("bench", help="benchmarks: speed, regress")
    bsub = bench.add_subparsers(dest="bench_command", required=True)

    s = bsub.add_parser("speed", help="sequential split decoding tok/s vs the unsplit bound, per RTT")
    add_model_args(s)
    s.add_argument("--rtt-ms", default="0,20,80", help="comma-separated RTTs (default %(default)s)")
    s.add_argument("--bandwidth-mbps", type=float, default=100.0)
    s.add_argument("--wire-dtype", default="fp16", choices=["fp16", "fp32", "bf16"])
    s.add_argument("--tokens", type=int, default=64, help="tokens generated per measurement")
    s.add_argument("--out", default=None, help="also write the figures as JSON here")
    s.add_argument("--no-server-memory", action="store_true",
                   help="skip measuring the cloud side's memory on a real `splitinfer serve` process")
    s.set_defaults(func=cmd_speed)

    e = bsub.add_parser("exactness", help="split vs unsplit greedy generation: token identity and logit diff")
    add_model_args(e, split_default=None)
    e.add_argument("--splits", default=None, help="splits separated by ';' (default 1,1;2,2;4,4;8,8;2,8;12,12)")
    e.add_argument("--prompts", type=int, default=8, help="number of built-in prompts (max 8)")
    e.add_argument("--tokens", type=int, default=64)
    e.add_argument("--wire", default="fp32,fp16", help="wire dtypes to check (default %(default)s)")
    e.add_argument("--out", default=None, help="also write the rows as JSON here")
    e.set_defaults(func=cmd_exactness)

    register_harness(bsub)
    from benchmarks.transport_cli import register as register_transport

    register_transport(bsub)
    from benchmarks.decoding_cli import register as register_decoding

    register_decoding(bsub)
    register_extract(bsub)
    from benchmarks.attacks_depth_cli import register as register_attacks_depth  # issue 6

    register_attacks_depth(bsub)

    from benchmarks import regress

    r = bsub.add_parser("regress", help="compare results.json against a committed baseline")
    regress.add_arguments(r)
    r.set_defaults(func=regress.run)


def cmd_run(args) -> int:
    from benchmarks.run import run_suite
    from benchmarks.suite import load_suite

    suite = load_suite(args.suite)
    out = args.out or f"reports/{suite.name}"
    path = run_suite(suite, out, stages=args.stages.split(",") if args.stages else None)
    print(f"results written to {path}")
    print(f"report written to {Path(out) / 'report.md'}")
    return 0


def cmd_report(args) -> int:
    from benchmarks.report import write_report
    from benchmarks.schema import load

    results = load(args.results)
    out = Path(args.out) if args.out else Path(args.results).parent
    print(f"report written to {write_report(results, out)}")
    return 0


def register_harness(bsub) -> None:
    """``bench run`` and ``bench report``."""
    r = bsub.add_parser("run", help="run a suite (ci, quick, full, paper or a .toml) -> results.json, report.md, plots")
    r.add_argument("--suite", default="quick")
    r.add_argument("--out", default=None, help="output directory (default reports/SUITE)")
    r.add_argument("--stages", default=None, help="comma-separated subset of the suite's stages")
    r.set_defaults(func=cmd_run)
    p = bsub.add_parser("report", help="rebuild report.md and plots from a results.json")
    p.add_argument("--results", required=True)
    p.add_argument("--out", default=None, help="directory (default: next to results.json)")
    p.set_defaults(func=cmd_report)


def cmd_extract(args) -> int:
    from attacks.cli import quiet_datasets
    from benchmarks.extract_speed import format_extract_speed, run_extract_speed
    from splitinfer.cli import load_for_cli

    quiet_datasets()
    loaded = load_for_cli(args)
    result = run_extract_speed(loaded, tuple(int(d) for d in args.depths.split(",")), args.corpus,
                               n_tokens=args.tokens, max_length=args.max_length, batch_size=args.batch_size,
                               repeats=args.repeats, threads=args.threads)
    print(format_extract_speed(result))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_json(out, result, indent=2, sort_keys=True)
        print(f"results written to {out}")
    return 0


def register_extract(bsub) -> None:
    """``bench extract``: activation-extraction tokens/s vs a plain truncated forward."""
    from splitinfer.cli import add_model_args

    x = bsub.add_parser("extract", help="activation extraction tok/s vs a plain truncated forward, per depth")
    add_model_args(x, split_default=None)
    x.add_argument("--depths", default="1,8,16", help="head depths (default %(default)s)")
    x.add_argument("--corpus", default="prose", help="corpus to extract (default %(default)s)")
    x.add_argument("--tokens", type=int, default=8192, help="tokens per measurement (default %(default)s)")
    x.add_argument("--max-length", type=int, default=256)
    x.add_argument("--batch-size", type=int, default=4)
    x.add_argument("--repeats", type=int, default=2, help="alternating runs; the fastest counts")
    x.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    x.add_argument("--out", default=None, help="also write the figures as JSON here")
    x.set_defaults(func=cmd_extract)
