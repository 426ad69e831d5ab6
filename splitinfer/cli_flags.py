"""The one flag vocabulary of every ``splitinfer`` command, and the frozen configs the flags become.

A leaf module: every command group (``splitinfer.cli``, ``splitinfer.cloud_cli``,
``attacks.cli``, ``benchmarks.cli``, ...) imports its flag helpers from here, and
it imports no command module, so the groups never import each other (issue 17).

The vocabulary:

- ``--model``, ``--split HEAD,TAIL``, ``--device``, ``--dtype``, ``--batch-invariant``,
  ``--seed`` (:func:`add_model_args`, read into :class:`ModelFlags` at the edge);
- ``--rtt-ms`` is always a comma list of milliseconds (commands that emulate one link
  take a list of one), ``--bandwidth-mbps``, ``--jitter-ms`` and ``--wire-dtype``
  (:func:`add_link_args`, :class:`LinkFlags`);
- ``--corpus`` names corpora (a comma list), ``--subset`` a corpus split
  (train | val | test | all);
- ``--max-new-tokens`` counts generated tokens, ``--max-tokens`` corpus tokens read,
  ``--train-tokens`` tokens a model is trained on;
- one option form, ``--<thing>-option KEY=VALUE`` (repeatable; ``NAME.KEY=VALUE`` for
  an option of the sub-component ``NAME``): :func:`parse_options`, :func:`split_options`.

Old spellings stay for a release as hidden :func:`add_deprecated` aliases that warn in one
line. Bad values end in one line (:class:`OneLineParser`), never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from dataclasses import dataclass
from typing import Any

from splitinfer.errors import SplitInferError
from splitinfer.options import parse_option_value

log = logging.getLogger("splitinfer")

WIRE_DTYPES = ("fp16", "fp32", "bf16")
SUBSETS = ("train", "val", "test", "all")


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (``PROG: error: ...; see PROG --help``), exit status 2.

    Sub-command parsers inherit the class (argparse builds them with ``type(parent)``).
    """

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


class _Deprecated(argparse.Action):
    """Store like the new flag, after a one-line warning naming the new spelling."""

    def __init__(self, option_strings, dest, new: str, append: bool = False, convert=None, **kwargs):
        self.new, self.append, self.convert = new, append, convert
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: warning: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        if self.nargs == 0:
            values = self.const
        elif self.append:  # a fresh list: never mutate the parser's default
            try:
                items = [values] if self.convert is None else self.convert(values)
            except ValueError as e:
                parser.error(f"{option_string}: {e}")
            values = [*(getattr(namespace, self.dest, None) or []), *items]
        setattr(namespace, self.dest, values)


def add_deprecated(p: argparse.ArgumentParser, old: str, new: str, dest: str, *, flag: bool = False,
                   append: bool = False, convert=None, type=None, choices=None) -> None:
    """Accept ``old`` as a hidden alias of ``new`` (storing into ``dest``); using it prints a deprecation warning.

    ``flag``: the old spelling takes no value (stores True); ``append``: it adds to a repeatable list, the
    items ``convert(value)`` returns (default: the value itself; ValueError = a bad value).
    """
    kwargs: dict[str, Any] = {"nargs": 0, "const": True} if flag else {"type": type, "choices": choices}
    p.add_argument(old, dest=dest, action=_Deprecated, new=new, append=append, convert=convert,
                   help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)


def _list_of(cast, what: str):
    def parse(text: str) -> tuple:
        items = [x.strip() for x in str(text).split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"{text!r} is empty; give a comma list of {what}")
        try:
            return tuple(cast(x) for x in items)
        except (ValueError, argparse.ArgumentTypeError):
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of {what}, e.g. 0,20,80") from None

    parse.__name__ = f"list of {what}"
    return parse


def finite_float(text: str) -> float:
    """argparse type: a finite number (NaN and inf are refused: every comparison with NaN is false, so a NaN
    flag would pass any later range check and run)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


float_list = _list_of(finite_float, "finite numbers")
int_list = _list_of(int, "integers")
name_list = _list_of(str, "names")


def positive_int_list(text: str) -> tuple:
    """argparse type: a comma list of integers >= 1."""
    return tuple(positive_int(x) for x in int_list(text))


def optional_int_list(text: str) -> tuple:
    """argparse type: like :func:`positive_int_list`, but '' is the empty list."""
    return positive_int_list(text) if text.strip() else ()


def wire_list(text: str) -> tuple:
    """argparse type: a comma list of wire dtypes."""
    values = name_list(text)
    bad = [v for v in values if v not in WIRE_DTYPES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown wire dtype {bad[0]!r}; choose from {', '.join(WIRE_DTYPES)}")
    return values


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


# ---------------------------------------------------------------------- KEY=VALUE options
def option_value(text: str) -> Any:
    """A JSON scalar when ``text`` parses as one (true/false/numbers, any case of true/false), else the text."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    return parse_option_value(text.strip())


def parse_options(items: list[str] | None, flag: str, example: str = "alpha=2") -> dict[str, Any]:
    """``["KEY=VALUE", "NAME.KEY=VALUE", ...]`` -> ``{key: value}``; dashes in keys become underscores.

    A sub-component prefix (``NAME.``) keeps its dashes (``feature-draft.shortlist``);
    :func:`split_options` groups those. ``flag`` and ``example`` name a bad item's fix.
    """
    opts: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SplitInferError(f"bad {flag} {item!r}: write KEY=VALUE, e.g. {flag} {example}")
        prefix, dot, name = key.strip().rpartition(".")
        opts[f"{prefix}{dot}{name.replace('-', '_')}"] = option_value(value)
    return opts


def split_options(opts: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``{"a": 1, "x.b": 2}`` -> ``({"a": 1}, {"x": {"b": 2}})``: plain options and per-sub-component ones."""
    plain: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in opts.items():
        prefix, dot, name = key.rpartition(".")
        if dot:
            nested.setdefault(prefix, {})[name] = value
        else:
            plain[key] = value
    return plain, nested


# ---------------------------------------------------------------------- model
@dataclass(frozen=True)
class ModelFlags:
    """What ``--model --device --dtype --batch-invariant --seed`` chose."""

    model: str = "default"
    device: str = "cpu"
    dtype: str = "fp32"
    batch_invariant: bool = False
    seed: int = 0

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ModelFlags:
        return cls(model=args.model, device=args.device, dtype=args.dtype, batch_invariant=args.batch_invariant,
                   seed=args.seed)

    def load(self):
        """The :class:`~splitinfer.models.LoadedModel` these flags name."""
        from splitinfer.models import load_model
        from splitinfer.server_config import check_device

        check_device(self.device)
        log.info("loading model %s", self.model)
        try:
            return load_model(self.model, dtype=self.dtype, device=self.device, seed=self.seed,
                              batch_invariant=self.batch_invariant)
        except (OSError, ValueError) as e:  # a damaged checkpoint, GGUF or tokenizer; a missing path says so itself
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SplitInferError(f"cannot load model {self.model!r}: {first}; give a model directory with "
                                  "config.json, weights and tokenizer, a .gguf file, or a name from --help") from None


def add_model_args(p: argparse.ArgumentParser, split_default: str | None = "2,2", seed: bool = True) -> None:
    """Flags shared by every command that loads a model (``seed=False``: the command adds its own ``--seed``)."""
    p.add_argument("--model", default="default",
                   help="default | gemma3-270m | tiny-random | DIR | FILE.gguf | org/name")
    if split_default is not None:
        p.add_argument("--split", default=split_default, help="HEAD,TAIL local layer counts (default %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default %(default)s)")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"], help="compute dtype")
    p.add_argument("--batch-invariant", action="store_true",
                   help="batch-invariant kernels: a token's logits do not depend on how many tokens share its "
                        "forward, so speculative decoding matches sequential bit for bit (slower; a cloud "
                        "server must use it too)")
    if seed:
        p.add_argument("--seed", type=int, default=0, help="seed (of sampling, corpus splits, tiny-random)")


# ---------------------------------------------------------------------- link
@dataclass(frozen=True)
class LinkFlags:
    """What ``--rtt-ms --bandwidth-mbps --jitter-ms --wire-dtype`` chose for one emulated link."""

    rtt_ms: float = 0.0
    bandwidth_mbps: float | None = None
    jitter_ms: float = 0.0
    wire_dtype: str | None = None  # None: the model family's default (SplitModel)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LinkFlags:
        return cls(rtt_ms=single(args.rtt_ms, "--rtt-ms"), bandwidth_mbps=args.bandwidth_mbps,
                   jitter_ms=args.jitter_ms, wire_dtype=args.wire_dtype)

    def wan(self, seed: int = 0):
        """The :class:`~splitinfer.link.WanProfile` of this link."""
        from splitinfer.link import WanProfile

        return WanProfile(rtt_ms=self.rtt_ms, bandwidth_mbps=self.bandwidth_mbps, jitter_ms=self.jitter_ms, seed=seed)


def single(values: tuple, flag: str):
    """The one value of a list flag given to a command that takes one (one-line error otherwise)."""
    if len(values) != 1:
        raise SplitInferError(f"{flag} takes one value here, got {','.join(map(str, values))}; "
                              "run once per value (or use `splitinfer bench speed` for a sweep)")
    return values[0]


def add_wire_dtype(p: argparse.ArgumentParser, default: str | None = None, many: bool = False) -> None:
    """``--wire-dtype`` (``many``: a comma list, e.g. fp32,fp16)."""
    if many:
        p.add_argument("--wire-dtype", type=wire_list, default=default or "fp16", help="comma list of hidden-state dtypes on "
                       f"the wire, from {', '.join(WIRE_DTYPES)} (default %(default)s)")
    else:
        p.add_argument("--wire-dtype", default=default, choices=WIRE_DTYPES,
                       help="hidden-state dtype on the wire (default: fp16, or bf16 for a model family whose states "
                            "exceed fp16's range, e.g. Gemma)")


def add_link_args(p: argparse.ArgumentParser, rtt_default: str = "0", bandwidth_default: float | None = None,
                  jitter: bool = True) -> None:
    """``--rtt-ms`` (a comma list), ``--bandwidth-mbps``, ``--jitter-ms`` and ``--wire-dtype``."""
    p.add_argument("--rtt-ms", type=float_list, default=float_list(rtt_default),
                   help=f"emulated round-trip time(s) in ms, comma-separated (default {rtt_default})")
    p.add_argument("--bandwidth-mbps", type=finite_float, default=bandwidth_default,
                   help="emulated bandwidth in Mbit/s (default %s)" % ("unlimited" if bandwidth_default is None
                                                                       else "%(default)s"))
    if jitter:
        p.add_argument("--jitter-ms", type=finite_float, default=0.0,
                       help="std-dev of emulated RTT jitter in ms (seeded)")
    add_wire_dtype(p)


def add_max_new_tokens(p: argparse.ArgumentParser, default: int, what: str) -> None:
    """``--max-new-tokens`` (generated tokens), with the old ``--tokens`` as a deprecated alias."""
    p.add_argument("--max-new-tokens", type=positive_int, default=default, help=f"{what} (default %(default)s)")
    add_deprecated(p, "--tokens", "--max-new-tokens", "max_new_tokens", type=positive_int)


def add_subset(p: argparse.ArgumentParser, help_default: str) -> None:
    """``--subset`` (a corpus split), with the old ``--split`` as a deprecated alias."""
    p.add_argument("--subset", default=None, choices=SUBSETS, help=f"corpus split (default: {help_default})")
    add_deprecated(p, "--split", "--subset", "subset", choices=SUBSETS)


def quiet_libraries() -> None:
    """Keep third-party progress bars and warnings off the user's terminal."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass


def quiet_datasets() -> None:
    """Keep the datasets library's progress bars ("Saving the dataset ...") and info logs off the terminal."""
    try:
        import datasets

        datasets.disable_progress_bars()
        datasets.utils.logging.set_verbosity_error()
    except ImportError:  # pragma: no cover
        pass
