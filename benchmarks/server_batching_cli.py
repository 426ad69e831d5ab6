"""``splitinfer bench batching``: the body server's tokens/s with concurrent sessions (see :mod:`benchmarks.server_batching`)."""

from __future__ import annotations

from splitinfer.cli_flags import (
    add_max_new_tokens,
    add_wire_dtype,
    finite_float,
    float_list,
    positive_int,
    positive_int_list,
)


def cmd_batching(args) -> int:
    from benchmarks.bench_output import emit
    from benchmarks.server_batching import batching_document, format_batching, run_batching
    from splitinfer.batch_scheduler import BatchConfig

    result = run_batching(
        args.model, args.split, sessions=tuple(args.sessions), rtts=tuple(args.rtt_ms), n_tokens=args.max_new_tokens,
        wire=args.wire_dtype, server_threads=args.server_threads,
        batch=BatchConfig(max_batch=args.max_batch, window_ms=args.batch_window_ms),
        batch_invariant=args.batch_invariant, repeats=args.repeats,
    )
    return emit(format_batching(result), lambda: batching_document(result), args.out)


def register(bsub) -> None:
    """Mount ``bench batching`` on the ``bench`` sub-command parser."""
    b = bsub.add_parser("batching", help="body server tok/s with 1..16 concurrent sessions, batched vs unbatched")
    b.add_argument("--model", default="default", help="model served (default %(default)s)")
    b.add_argument("--split", default="2,2")
    b.add_argument("--sessions", type=positive_int_list, default="1,2,4,8,16",
                   help="concurrent session counts (default %(default)s)")
    b.add_argument("--rtt-ms", type=float_list, default="0,80",
                   help="round trip each replay client waits after every reply, comma list (default %(default)s)")
    add_max_new_tokens(b, 32, "decode steps recorded and replayed per session")
    add_wire_dtype(b, "fp16")
    b.add_argument("--server-threads", type=positive_int, default=2, help="OMP_NUM_THREADS of the server (default 2)")
    b.add_argument("--max-batch", type=int, default=16, help="the batched server's --max-batch (default 16)")
    b.add_argument("--batch-window-ms", type=finite_float, default=5.0,
                   help="the servers' --batch-window-ms (default 5)")
    b.add_argument("--batch-invariant", action="store_true", help="both servers with batch-invariant kernels")
    b.add_argument("--repeats", type=positive_int, default=3,
                   help="times each cell is measured, the modes interleaved; rows are medians (default %(default)s)")
    b.add_argument("--out", default=None, help="also write the results document (JSON) here")
    b.set_defaults(func=cmd_batching)
