"""``splitinfer bench attacks``: the per-depth inversion study (:mod:`benchmarks.attacks_depth`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from splitinfer.cli_flags import (
    add_deprecated,
    int_list,
    name_list,
    parse_options,
    positive_int_list,
    split_options,
)
from splitinfer.errors import SplitInferError

log = logging.getLogger(__name__)


def hparams_json_items(text: str) -> list[str]:
    """The deprecated ``--hparams JSON`` (``{"mlp": {"epochs": 20}}``) as ``--attack-option`` items (mlp.epochs=20)."""
    try:
        table = json.loads(text)
        return [f"{name}.{key}={json.dumps(v)}" for name, extra in table.items() for key, v in extra.items()]
    except (ValueError, AttributeError):
        raise ValueError(f"{text!r} is not a JSON object of objects, e.g. '{{\"mlp\": {{\"epochs\": 20}}}}'") from None


def attack_hparams(base: dict[str, dict], items: list[str]) -> dict[str, dict]:
    """The study's per-attack hyper-parameters: ``base`` updated by ``--attack-option NAME.KEY=VALUE`` items."""
    plain, nested = split_options(parse_options(items, "--attack-option", "mlp.epochs=20"))
    if plain:
        raise SplitInferError(f"bench attacks needs the attack in each --attack-option: NAME.KEY=VALUE, e.g. "
                              f"mlp.epochs=20 (got {', '.join(sorted(plain))})")
    hparams = {k: dict(v) for k, v in base.items()}
    for name, extra in nested.items():
        hparams.setdefault(name, {}).update(extra)
    return hparams


def cmd_attacks(args) -> int:
    from benchmarks.attacks_depth import PARTIAL_NAME, StudyConfig, run_study, write_outputs
    from splitinfer.cli_flags import quiet_datasets

    from attacks.registry import get_attack_class
    from splitinfer.server_config import check_device

    quiet_datasets()
    check_device(args.device)
    for name in args.attacks:  # a bad name fails now, not after the model loads and the corpora are extracted
        get_attack_class(name)
    base = StudyConfig()
    cfg = StudyConfig(
        model=args.model, head_depths=args.head_depths, tail_layers=args.tail_layers,
        corpora=args.corpus, train_tokens=args.train_tokens, val_tokens=args.val_tokens,
        test_tokens=args.test_tokens, max_length=args.max_length, max_doc_tokens=args.max_doc_tokens,
        vocab_match_tokens=args.vocab_match_tokens, vocab_match_pii_tokens=args.vocab_match_pii_tokens,
        vocab_match_depths=args.vocab_match_depths, attacks=args.attacks,
        hparams=attack_hparams(base.hparams, args.attack_option), seed=args.seed, train_seeds=args.train_seeds,
        min_pii_spans=args.min_pii_spans, n_boot=args.n_boot, device=args.device)
    study = run_study(cfg, progress=not args.quiet, partial=Path(args.out) / PARTIAL_NAME, predictions_dir=args.out)
    path_json, path_md = write_outputs(study, args.out)
    print(path_md.read_text(encoding="utf-8"))
    print(f"results written to {path_json} and {path_md}")
    return 0


def register(bsub) -> None:
    from benchmarks.attacks_depth import StudyConfig

    d = StudyConfig()
    p = bsub.add_parser("attacks", help="per-depth inversion study: every attacker at every split depth -> JSON + "
                        "Markdown (CPU-sized defaults; raise the sizes on a GPU)")
    p.add_argument("--model", default=d.model)
    p.add_argument("--device", default=d.device, help="model and attacker device: cpu | cuda (default %(default)s)")
    p.add_argument("--head-depths", type=positive_int_list, default=",".join(map(str, d.head_depths)),
                   help="default %(default)s")
    p.add_argument("--tail-layers", type=positive_int_list, default=",".join(map(str, d.tail_layers)),
                   help="output side: tail layers B, depth L-B (default %(default)s)")
    p.add_argument("--corpus", type=name_list, default=",".join(d.corpora), help="comma list (default %(default)s)")
    add_deprecated(p, "--corpora", "--corpus", "corpus", type=name_list)
    p.add_argument("--attacks", type=name_list, default=",".join(d.attacks), help="default %(default)s")
    p.add_argument("--train-tokens", type=int, default=d.train_tokens, help="per corpus (default %(default)s)")
    p.add_argument("--val-tokens", type=int, default=d.val_tokens, help="per corpus (default %(default)s)")
    p.add_argument("--test-tokens", type=int, default=d.test_tokens, help="per corpus (default %(default)s)")
    p.add_argument("--max-length", type=int, default=d.max_length)
    p.add_argument("--max-doc-tokens", type=int, default=d.max_doc_tokens, help="tokens kept per document")
    p.add_argument("--vocab-match-tokens", type=int, default=d.vocab_match_tokens, help="per corpus")
    p.add_argument("--vocab-match-pii-tokens", type=int, default=d.vocab_match_pii_tokens,
                   help="prefix length of the two sequences of PII corpora scored by vocab-match")
    p.add_argument("--vocab-match-depths", type=positive_int_list, default=None,
                   help="head depths where vocab-match runs (default: every head depth; it takes seconds per token "
                   "on CPU at deep splits)")
    p.add_argument("--attack-option", action="append", default=[], metavar="NAME.KEY=VALUE",
                   help="a hyper-parameter of attack NAME (repeatable), e.g. mlp.epochs=20 "
                   f"(defaults: {json.dumps(d.hparams)})")
    add_deprecated(p, "--hparams", "--attack-option NAME.KEY=VALUE", "attack_option", append=True,
                   convert=hparams_json_items)
    p.add_argument("--min-pii-spans", type=int, default=d.min_pii_spans,
                   help="the PII test split grows until every span type has this many scored spans (0: "
                   "--test-tokens only; default %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="data seed: splits and sampling (default %(default)s)")
    p.add_argument("--train-seeds", type=int_list, default=",".join(map(str, d.train_seeds)),
                   help="learned attackers are fitted once per seed; the tables show the first, the report the "
                   "mean and spread across seeds (default %(default)s)")
    p.add_argument("--n-boot", type=int, default=d.n_boot)
    p.add_argument("--out", default="reports/attacks_depth", help="output directory (default %(default)s)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_attacks)
