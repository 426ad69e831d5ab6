"""Command-line flags that choose a proposer and its options (``splitinfer generate``, benchmarks)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from splitinfer.cli_flags import finite_float, parse_options

# flag -> proposer option it sets (None = leave the proposer's default)
FLAGS = {
    "draft_budget": "--draft-budget", "ngram": "--ngram", "window": "--window", "pool": "--pool", "block": "--block",
    "calibration": "--draft-calibration", "alternatives": "--alternatives", "draft_head": "--draft-head",
}
SIZING_HELP = (
    "combined, local-draft, feature-draft: the round-trip time in ms the draft tree is sized for (default: the "
    "link's: --rtt-ms when an emulated link is named, else the RTT measured on the steps, about 0 in-process). "
    "tau, the tokens per round trip, depends on it: a draft sized for a long RTT is larger (each extra position "
    "costs compute that the round trip dwarfs) and commits more tokens per round trip than one sized for RTT 0; "
    "set it to your deployment's RTT to see the tau you would get there")


def add_decoding_args(p: argparse.ArgumentParser) -> None:
    from splitinfer.decoding.base import list_proposers

    p.add_argument("--decoding", default="sequential", choices=list_proposers(),
                   help="proposer whose drafts are verified each round trip (default %(default)s; combined sizes "
                        "its draft for the link's RTT, see --draft-rtt-ms)")
    p.add_argument("--draft-rtt-ms", dest="draft_rtt_ms", type=finite_float, default=None, metavar="MS",
                   help=SIZING_HELP)
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


@dataclass(frozen=True)
class DecodingFlags:
    """What ``--decoding`` and its option flags chose: the proposer's name and its options."""

    name: str = "sequential"
    options: dict = field(default_factory=dict)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DecodingFlags:
        """The flags of :func:`add_decoding_args`; ``options`` is what :func:`~.base.make_proposer` takes."""
        flags = vars(args)
        opts = {k: flags[k] for k in FLAGS if flags[k] is not None}
        if flags.get("draft_rtt_ms") is not None:  # its own dest: --rtt-ms (the emulated link) is rtt_ms
            opts["rtt_ms"] = flags["draft_rtt_ms"]
        return cls(name=args.decoding, options={**opts, **parse_options(args.decoding_option, "--decoding-option")})
