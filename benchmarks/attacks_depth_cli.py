"""``splitinfer bench attacks``: the per-depth inversion study (:mod:`benchmarks.attacks_depth`)."""

from __future__ import annotations

import json
import logging

log = logging.getLogger(__name__)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def cmd_attacks(args) -> int:
    from attacks.cli import quiet_datasets
    from benchmarks.attacks_depth import StudyConfig, run_study, write_outputs

    quiet_datasets()
    base = StudyConfig()
    hparams = {k: dict(v) for k, v in base.hparams.items()}
    for name, extra in json.loads(args.hparams or "{}").items():
        hparams.setdefault(name, {}).update(extra)
    cfg = StudyConfig(
        model=args.model, head_depths=_ints(args.head_depths), tail_layers=_ints(args.tail_layers),
        corpora=_names(args.corpora), train_tokens=args.train_tokens, val_tokens=args.val_tokens,
        test_tokens=args.test_tokens, max_length=args.max_length, max_doc_tokens=args.max_doc_tokens,
        vocab_match_tokens=args.vocab_match_tokens, vocab_match_pii_tokens=args.vocab_match_pii_tokens,
        vocab_match_depths=_ints(args.vocab_match_depths) if args.vocab_match_depths else None,
        attacks=_names(args.attacks), hparams=hparams, seed=args.seed, n_boot=args.n_boot, device=args.device)
    from pathlib import Path

    from benchmarks.attacks_depth import PARTIAL_NAME

    study = run_study(cfg, progress=not args.quiet, partial=Path(args.out) / PARTIAL_NAME)
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
    p.add_argument("--head-depths", default=",".join(map(str, d.head_depths)), help="default %(default)s")
    p.add_argument("--tail-layers", default=",".join(map(str, d.tail_layers)),
                   help="output side: tail layers B, depth L-B (default %(default)s)")
    p.add_argument("--corpora", default=",".join(d.corpora), help="default %(default)s")
    p.add_argument("--attacks", default=",".join(d.attacks), help="default %(default)s")
    p.add_argument("--train-tokens", type=int, default=d.train_tokens, help="per corpus (default %(default)s)")
    p.add_argument("--val-tokens", type=int, default=d.val_tokens, help="per corpus (default %(default)s)")
    p.add_argument("--test-tokens", type=int, default=d.test_tokens, help="per corpus (default %(default)s)")
    p.add_argument("--max-length", type=int, default=d.max_length)
    p.add_argument("--max-doc-tokens", type=int, default=d.max_doc_tokens, help="tokens kept per document")
    p.add_argument("--vocab-match-tokens", type=int, default=d.vocab_match_tokens, help="per corpus")
    p.add_argument("--vocab-match-pii-tokens", type=int, default=d.vocab_match_pii_tokens,
                   help="prefix length of the two sequences of PII corpora scored by vocab-match")
    p.add_argument("--vocab-match-depths", default=None,
                   help="head depths where vocab-match runs (default: every head depth; it takes seconds per token "
                   "on CPU at deep splits)")
    p.add_argument("--hparams", default=None, help='JSON overrides per attack, e.g. \'{"mlp": {"epochs": 20}}\' '
                   f"(defaults: {json.dumps(d.hparams)})")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--n-boot", type=int, default=d.n_boot)
    p.add_argument("--out", default="reports/attacks_depth", help="output directory (default %(default)s)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_attacks)
