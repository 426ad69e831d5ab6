"""``splitinfer attack ...``: corpora listing (and, as they land, extraction, training, evaluation)."""

from __future__ import annotations


def cmd_corpora(args) -> int:
    from attacks.corpora import count_tokens, list_corpora, load_corpus
    from splitinfer.cli import load_for_cli

    tokenizer = load_for_cli(args).tokenizer if args.tokens else None
    print(f"{'corpus':<8} {'genre':<10} {'split':<6} {'docs':>6} {'tokens':>10}  description")
    for info in list_corpora():
        if info["name"].endswith(":"):
            print(f"{info['name'] + '...':<8} {info['genre']:<10} {'-':<6} {'-':>6} {'-':>10}  {info['description']}")
            continue
        for split in ("train", "val", "test"):
            ds = load_corpus(info["name"], split=split, seed=args.seed, tokenizer=tokenizer)
            n_tok = count_tokens(ds, tokenizer) if tokenizer is not None else "-"
            desc = info["description"] if split == "train" else ""
            print(f"{info['name']:<8} {info['genre']:<10} {split:<6} {len(ds):>6} {n_tok:>10}  {desc}")
    return 0


def register(sub) -> None:
    from splitinfer.cli import add_model_args

    attack = sub.add_parser("attack", help="inversion attacks: corpora, ...")
    asub = attack.add_subparsers(dest="attack_command", required=True)
    c = asub.add_parser("corpora", help="list the corpora with document (and token) counts per split")
    add_model_args(c, split_default=None)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--tokens", action="store_true", help="also count tokens with --model's tokenizer")
    c.set_defaults(func=cmd_corpora)
