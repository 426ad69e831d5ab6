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

import errno
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
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import a plugin module (dotted name or .py path) that registers attacks, defenses, "
                             "proposers or corpora; repeatable, allowed anywhere on the line (installed plugins "
                             "are found through their entry points without it; docs/extending.md)")
    sub = parser.add_subparsers(dest="command", required=True)
    register_generate(sub)
    register_bench(sub)
    register_cloud(sub)
    register_attack(sub)
    return parser


def plugin_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the ``--plugin MODULE`` / ``--plugin=MODULE`` values anywhere in ``argv``, the other arguments).

    Read before parsing, so that a plugin's components exist when the sub-command's flags are checked and
    ``--plugin`` may stand before or after the sub-command."""
    plugins, rest, it = [], [], iter(argv)
    for a in it:
        if a == "--plugin":
            value = next(it, None)
            if value is None or value.startswith("-"):
                raise SplitInferError("--plugin needs a module name or a .py path, e.g. --plugin my_pkg.defense")
            plugins.append(value)
        elif a.startswith("--plugin="):
            plugins.append(a.partition("=")[2])
        else:
            rest.append(a)
    return plugins, rest


_OS_FIXES = {
    errno.EEXIST: "a file is in the way of a directory there: choose another path or move the file",
    errno.ENOTDIR: "part of the path is a file, not a directory: choose another path",
    errno.EISDIR: "it is a directory: give a file path",
    errno.ENOENT: "check the path (its directory must exist)",
    errno.EACCES: "choose a path you can write to",
    errno.ENOSPC: "free some disk space and run it again",
}


def os_error_line(e: OSError) -> str:
    """One line for an OSError: the path, what is wrong with it and what to do."""
    fix = _OS_FIXES.get(e.errno or -1, "check the path")
    where = f"{e.filename}: " if e.filename is not None else ""
    return f"{where}{e.strerror or e}; {fix}"


def main(argv: list[str] | None = None) -> int:
    from attacks.errors import AttackError
    from attacks.plugins import discover, load_modules
    from benchmarks.checkout import forget_git_state, remember_git_state
    from benchmarks.schema import SchemaError

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        plugins, argv = plugin_args(argv)
        discover()  # installed entry points: no flag needed
        load_modules(plugins)
    except SplitInferError as e:
        print(f"splitinfer: error: {e}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    quiet_libraries()

    remember_git_state()  # results record the code as the command found it, not with its own outputs written
    try:
        return int(args.func(args) or 0)
    except (SplitInferError, AttackError, SchemaError) as e:
        print(f"splitinfer: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # an output or input path that cannot be used (exists as a file, is a directory, ...)
        print(f"splitinfer: error: {os_error_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("splitinfer: interrupted", file=sys.stderr)
        return 130
    finally:
        forget_git_state()


if __name__ == "__main__":
    sys.exit(main())
