"""Command-line flags that choose a proposer and its options (``splitinfer generate``, benchmarks)."""

from __future__ import annotations

import argparse

from splitinfer.errors import SplitInferError

# flag -> proposer option it sets (None = leave the proposer's default)
FLAGS = {
    "draft_budget": "--draft-budget", "ngram": "--ngram", "window": "--window", "pool": "--pool", "block": "--block",
    "calibration": "--draft-calibration", "alternatives": "--alternatives", "draft_head": "--draft-head",
}


def add_decoding_args(p: argparse.ArgumentParser) -> None:
    from splitinfer.decoding.base import list_proposers

    p.add_argument("--decoding", default="sequential", choices=list_proposers(),
                   help="proposer whose drafts are verified each round trip (default %(default)s)")
    p.add_argument("--draft-budget", type=int, default=None, metavar="T",
                   help="max draft tokens per step (prompt-lookup, suffix, combined, local-draft, feature-draft)")
    p.add_argument("--ngram", type=int, default=None, metavar="N",
                   help="n-gram size (ngram-pool, lookahead) or max match length (prompt-lookup)")
    p.add_argument("--window", type=int, default=None, metavar="W", help="lookahead: Jacobi window width")
    p.add_argument("--pool", type=int, default=None, metavar="G", help="ngram-pool / lookahead: candidates per key")
    p.add_argument("--block", type=int, default=None, metavar="K", help="jacobi: block size")
    p.add_argument("--draft-calibration", dest="calibration", default=None, metavar="PATH",
                   help="local-draft: bridge calibration written by `splitinfer draft-calibrate --out PATH`")
    p.add_argument("--draft-head", dest="draft_head", default=None, metavar="DIR",
                   help="feature-draft: trained head written by `splitinfer draft-train --out DIR` "
                        "(default: the cache directory draft-train writes to)")
    p.add_argument("--alternatives", type=int, default=None, metavar="K",
                   help="local-draft: depths that also offer the draft's runner-up token")
    p.add_argument("--decoding-option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other proposer option, e.g. alpha=2 or rtt_ms=80 (repeatable)")


def _value(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def decoding_options(args: argparse.Namespace) -> dict:
    """The options dict for :func:`~splitinfer.decoding.base.make_proposer` from parsed flags."""
    opts = {k: getattr(args, k) for k in FLAGS if getattr(args, k, None) is not None}
    return {**opts, **parse_options(getattr(args, "decoding_option", []) or [], "--decoding-option")}


def parse_options(items: list[str], flag: str) -> dict:
    """``["KEY=VALUE", ...]`` -> proposer options (true/false, numbers, else text); ``flag`` names bad items."""
    opts = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SplitInferError(f"bad {flag} {item!r}: write KEY=VALUE, e.g. alpha=2")
        opts[key.strip().replace("-", "_")] = _value(value.strip())
    return opts
