"""The ``splitinfer`` command: the one console-script module, which composes every command group.

Each package owns its sub-commands and mounts them with ``register(subparsers)``:
:mod:`splitinfer.generate_cli` (``generate``, ``draft-calibrate``, ``draft-train``),
:mod:`splitinfer.cloud_cli` (``serve``, ``chat``), :mod:`attacks.cli` (``attack ...``) and
:mod:`benchmarks.cli` (``bench ...``). This is the only module of ``splitinfer`` that imports
``attacks`` or ``benchmarks``; the groups share their flags through the leaf module
:mod:`splitinfer.cli_flags` and never import each other or this module.

Errors the user can fix print one line (``splitinfer: error: ...``) and exit with status 2,
never a traceback.
"""

from __future__ import annotations

import logging
import sys

from splitinfer.cli_flags import OneLineParser, quiet_libraries
from splitinfer.errors import SplitInferError


def build_parser() -> OneLineParser:
    from attacks.cli import register as register_attack
    from benchmarks.cli import register as register_bench
    from splitinfer.cloud_cli import register as register_cloud
    from splitinfer.generate_cli import register as register_generate

    parser = OneLineParser(prog="splitinfer", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    register_generate(sub)
    register_bench(sub)
    register_cloud(sub)
    register_attack(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    quiet_libraries()
    from attacks.errors import AttackError
    from benchmarks.schema import SchemaError

    try:
        return int(args.func(args) or 0)
    except (SplitInferError, AttackError, SchemaError) as e:
        print(f"splitinfer: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("splitinfer: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
