"""``splitinfer bench ...``: speed benchmark and results regression check."""

from __future__ import annotations

import json
from pathlib import Path


def cmd_speed(args) -> int:
    from benchmarks.speed import format_speed, run_speed
    from splitinfer.cli import load_for_cli
    from splitinfer.partition import SplitConfig

    loaded = load_for_cli(args)
    rtts = [float(x) for x in args.rtt_ms.split(",")]
    result = run_speed(
        loaded, SplitConfig.parse(args.split), rtts, n_tokens=args.tokens,
        bandwidth_mbps=args.bandwidth_mbps, wire=args.wire_dtype,
    )
    print(format_speed(result))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, sort_keys=True))
        print(f"results written to {out}")
    return 0


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
    s.set_defaults(func=cmd_speed)

    from benchmarks import regress

    r = bsub.add_parser("regress", help="compare results.json against a committed baseline")
    regress.add_arguments(r)
    r.set_defaults(func=regress.run)
