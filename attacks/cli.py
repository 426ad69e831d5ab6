"""``splitinfer attack ...``: corpora listing and activation extraction (train, eval, list: :mod:`attacks.train`)."""

from __future__ import annotations

import json
import time

from attacks.train import add_parsers, add_tap_args
from splitinfer.cli_flags import (
    ModelFlags,
    add_deprecated,
    add_model_args,
    positive_int,
    quiet_datasets,
)


def cmd_corpora(args) -> int:
    from splitinfer.corpora import count_tokens, list_corpora, load_corpus

    quiet_datasets()
    model = ModelFlags.from_args(args)
    tokenizer = model.load().tokenizer if args.count_tokens else None
    print(f"{'corpus':<8} {'genre':<10} {'split':<6} {'docs':>6} {'tokens':>10}  description")
    for info in list_corpora():
        if ":" in info["name"]:  # a pattern such as file:<path> or hf:<dataset>...: nothing to load
            print(f"{info['name']}\n{'':<8} {info['genre']:<10} {'-':<6} {'-':>6} {'-':>10}  {info['description']}")
            continue
        for split in ("train", "val", "test"):
            ds = load_corpus(info["name"], split=split, seed=model.seed, tokenizer=tokenizer)
            n_tok = count_tokens(ds, tokenizer) if tokenizer is not None else "-"
            desc = info["description"] if split == "train" else ""
            print(f"{info['name']:<8} {info['genre']:<10} {split:<6} {len(ds):>6} {n_tok:>10}  {desc}")
    return 0


def cmd_extract(args) -> int:
    from attacks.taps import extract_corpora, parse_corpora

    quiet_datasets()
    corpora = parse_corpora(args.corpus)
    boundaries = args.boundary
    model = ModelFlags.from_args(args)
    loaded = model.load()
    for b in boundaries:  # fail on a bad boundary before any work
        b.validate(loaded.num_layers)
    rows = []
    for b in boundaries:
        t0 = time.perf_counter()
        sets = extract_corpora(
            loaded, corpora, b, args.subset, max_tokens=args.max_tokens, max_length=args.max_length,
            batch_size=args.batch_size, padded=args.padded, dtype=args.store_dtype, seed=model.seed,
            progress=not args.json,
        )
        wall = time.perf_counter() - t0
        for name, ts in zip(corpora, sets):
            rows.append({"corpus": name, "split": ts.index["split"], "boundary": str(b), "depth": ts.index["depth"],
                         "documents": len(ts.doc_ids), "sequences": len(ts), "tokens": ts.n_tokens,
                         "path": str(ts.path)})
        n_tok = sum(r["tokens"] for r in rows if r["boundary"] == str(b))
        print(f"{b}: {n_tok} tokens ready in {wall:.1f} s", flush=True)
    print(f"{'corpus':<12} {'split':<6} {'boundary':<9} {'docs':>6} {'seqs':>7} {'tokens':>9}  path")
    for r in rows:
        print(f"{r['corpus']:<12} {r['split']:<6} {r['boundary']:<9} {r['documents']:>6} {r['sequences']:>7} "
              f"{r['tokens']:>9}  {r['path']}")
    if args.json:
        print(json.dumps({"model": loaded.spec, "model_sha256": loaded.sha256, "taps": rows}))
    return 0


def register(sub) -> None:
    """Mount ``attack corpora | extract | train | eval | list`` on the ``splitinfer`` sub-command parser."""
    attack = sub.add_parser("attack", help="inversion attacks: corpora, extract, train, eval, list")
    asub = attack.add_subparsers(dest="attack_command", required=True)
    c = asub.add_parser("corpora", help="list the corpora with document (and token) counts per split")
    add_model_args(c, split_default=None)
    c.add_argument("--count-tokens", action="store_true", help="also count tokens with --model's tokenizer")
    add_deprecated(c, "--tokens", "--count-tokens", "count_tokens", flag=True)
    c.set_defaults(func=cmd_corpora)

    e = asub.add_parser("extract", help="hidden states at a split boundary for corpora (cached under the cache dir)")
    add_model_args(e, split_default=None)
    add_tap_args(e, "comma-separated boundaries: head:A (after A layers; what the cloud receives) or tail:B "
                    "(after L-B layers; what the cloud returns to a B-layer tail)",
                 "total tokens, split evenly across the corpora")
    e.add_argument("--max-length", type=positive_int, default=256, help="tokens per sequence; longer documents are "
                   "cut into sequences (default %(default)s)")
    e.add_argument("--batch-size", type=positive_int, default=4, help="sequences per forward (default %(default)s)")
    e.add_argument("--padded", action="store_true", help="also batch unequal lengths with right padding (faster on "
                   "short documents; equal to the unpadded states up to float rounding)")
    e.add_argument("--store-dtype", default="fp16", choices=["fp16", "fp32"], help="stored hidden-state dtype")
    e.add_argument("--json", action="store_true", help="no progress bar; print a JSON summary as the last line")
    e.set_defaults(func=cmd_extract)

    add_parsers(asub)
