"""``splitinfer bench transport``: real loopback WebSocket vs in-process link (see :mod:`benchmarks.transport`)."""

from __future__ import annotations

from splitinfer.cli_flags import add_max_new_tokens, add_wire_dtype, optional_int_list, positive_int, positive_int_list



def cmd_transport(args) -> int:
    from benchmarks.bench_output import emit, transport_document
    from benchmarks.transport import format_transport, run_transport

    result = run_transport(
        args.model, args.split, n_tokens=args.max_new_tokens, repeats=args.repeats, sessions=args.sessions,
        synthetic_hidden=args.synthetic_hidden, wire=args.wire_dtype, server_threads=args.server_threads,
    )
    return emit(format_transport(result), lambda: transport_document(result), args.out)


def register(bsub) -> None:
    """Mount ``bench transport`` on the ``bench`` sub-command parser."""
    t = bsub.add_parser("transport", help="per-step cost of the WebSocket transport vs in-process; concurrency")
    t.add_argument("--model", default="default", help="model served and used by the clients (default %(default)s)")
    t.add_argument("--split", default="2,2")
    add_max_new_tokens(t, 64, "decode steps per measurement")
    t.add_argument("--repeats", type=positive_int, default=3, help="interleaved repeats per link")
    t.add_argument("--sessions", type=positive_int_list, default="1,2,4,8",
                   help="concurrent session counts (default %(default)s)")
    t.add_argument("--synthetic-hidden", type=optional_int_list, default="576,4096",
                   help="hidden sizes of compute-free synthetic bodies ('' for none; default %(default)s)")
    add_wire_dtype(t, "fp16")
    t.add_argument("--server-threads", type=positive_int, default=1, help="OMP_NUM_THREADS of the server process")
    t.add_argument("--out", default=None, help="also write the results document (JSON) here")
    t.set_defaults(func=cmd_transport)
