"""``splitinfer bench transport``: real loopback WebSocket vs in-process link (see :mod:`benchmarks.transport`)."""

from __future__ import annotations

from pathlib import Path

from splitinfer import atomic


def cmd_transport(args) -> int:
    from benchmarks.transport import format_transport, run_transport

    result = run_transport(
        args.model, args.split, n_tokens=args.tokens, repeats=args.repeats,
        sessions=tuple(int(x) for x in args.sessions.split(",")),
        synthetic_hidden=tuple(int(x) for x in args.synthetic_hidden.split(",")) if args.synthetic_hidden else (),
        wire=args.wire_dtype, server_threads=args.server_threads,
    )
    print(format_transport(result))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_json(out, result, indent=2, sort_keys=True)
        print(f"results written to {out}")
    return 0


def register(bsub) -> None:
    """Mount ``bench transport`` on the ``bench`` sub-command parser."""
    t = bsub.add_parser("transport", help="per-step cost of the WebSocket transport vs in-process; concurrency")
    t.add_argument("--model", default="default", help="model served and used by the clients (default %(default)s)")
    t.add_argument("--split", default="2,2")
    t.add_argument("--tokens", type=int, default=64, help="decode steps per measurement")
    t.add_argument("--repeats", type=int, default=3, help="interleaved repeats per link")
    t.add_argument("--sessions", default="1,2,4,8", help="concurrent session counts (default %(default)s)")
    t.add_argument("--synthetic-hidden", default="576,4096",
                   help="hidden sizes of compute-free synthetic bodies ('' for none; default %(default)s)")
    t.add_argument("--wire-dtype", default="fp16", choices=["fp16", "fp32", "bf16"])
    t.add_argument("--server-threads", type=int, default=1, help="OMP_NUM_THREADS of the server process")
    t.add_argument("--out", default=None, help="also write the figures as JSON here")
    t.set_defaults(func=cmd_transport)
