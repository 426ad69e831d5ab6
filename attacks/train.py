"""``splitinfer attack train | eval | list``: train an attacker on corpus taps, score it on any corpus, list recipes.

``train`` extracts (or reuses cached) taps with :func:`attacks.taps.extract_corpora`
for the train split (and the val split of built-in corpora), fits the recipe
and writes the checkpoint (``config.json`` + ``attack.safetensors``) to
``--out``; gradient-trained recipes also write per-epoch training checkpoints
under ``--out/checkpoints`` and resume from them. Under ``accelerate launch
--num_processes N`` the main process extracts first (the others then read the
cache), training runs as DDP, and only the main process writes.

``eval`` loads a checkpoint with the model it records (checking the sha256),
extracts the corpus at the checkpoint's boundary, inverts and scores; with
``--json`` the last line is one JSON object (see :func:`attacks.evaluate.flat_report`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

from attacks.errors import AttackError

log = logging.getLogger(__name__)


def parse_hparams(items: list[str] | None) -> dict[str, Any]:
    """``["epochs=3", "protocol=seed"]`` -> ``{"epochs": 3, "protocol": "seed"}`` (JSON values where they parse)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise AttackError(f"bad --hparam {item!r}: write KEY=VALUE, e.g. --hparam epochs=3")
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value
    return out


def _val_split_ok(corpora: list[str]) -> bool:
    return all(":" not in c for c in corpora)


def cmd_train(args) -> int:
    from attacks.cli import quiet_datasets
    from attacks.registry import get_attack_class
    from attacks.taps import Boundary, extract_corpora, parse_corpora
    from attacks.defended import attacker_view, defend_taps
    from attacks.tapdata import as_taps
    from attacks.trainer import TrainConfig, get_accelerator
    from splitinfer.cli import load_for_cli
    from splitinfer.defenses.cli_args import defense_from_args

    quiet_datasets()
    klass = get_attack_class(args.attack)
    hparams = parse_hparams(args.hparam)
    for flag in ("epochs", "lr", "batch_size"):
        if getattr(args, flag) is not None and flag in klass.defaults:
            hparams[flag] = getattr(args, flag)
    corpora = parse_corpora(args.corpus)
    boundaries = [Boundary.parse(b) for b in args.boundary.split(",") if b.strip()]
    if not boundaries:
        raise AttackError("no boundary given, e.g. --boundary head:4")
    if len(boundaries) > 1 and klass.name != "depth-id":
        raise AttackError(f"attack {klass.name!r} trains at one boundary; got {len(boundaries)}: {args.boundary}")
    out = Path(args.out)
    acc = get_accelerator()
    main = acc is None or acc.is_main_process
    loaded = load_for_cli(args)
    for b in boundaries:
        b.validate(loaded.num_layers)
    extract = dict(max_length=args.max_length, batch_size=args.extract_batch_size, seed=args.seed,
                   progress=main and not args.json)
    first = acc.main_process_first() if acc is not None else contextlib.nullcontext()
    with first:  # the main process extracts, the others then hit the cache
        train = {str(b): extract_corpora(loaded, corpora, b, args.split, max_tokens=args.max_tokens, **extract)
                 for b in boundaries}
        val = None
        if args.val_tokens and _val_split_ok(corpora) and args.split in (None, "train"):
            val = {str(b): extract_corpora(loaded, corpora, b, "val", max_tokens=args.val_tokens, **extract)
                   for b in boundaries}
    own = attacker_view(defense_from_args(args))  # adaptive: trains on its own defended pairs (public weights)
    train = {k: defend_taps(as_taps(v), own) for k, v in train.items()} if not own.is_none else train
    val = {k: defend_taps(as_taps(v), own) for k, v in val.items()} if val and not own.is_none else val
    attack = klass(model=loaded, seed=args.seed, **hparams)
    trainer = TrainConfig(checkpoint_dir=str(out / "checkpoints"), resume=not args.no_resume,
                          progress=main and not args.json)
    if klass.name == "depth-id":
        attack.fit(list(train.values()), trainer=trainer)
    else:
        key = str(boundaries[0])
        attack.fit(train[key], None if val is None else val[key], trainer=trainer)
    attack.meta.update(max_length=args.max_length, corpora=corpora, train_max_tokens=args.max_tokens,
                       defense=defense_from_args(args).label)
    if main:
        attack.save(out)
        summary = {"attack": attack.name, "threat_model": attack.threat_model, "out": str(out),
                   "boundary": attack.meta.get("boundary"), "model": loaded.spec, "model_sha256": loaded.sha256,
                   "train_tokens": attack.meta.get("train_tokens"), "fit_report": attack.fit_report}
        print(f"trained {attack.name} at {args.boundary} on {','.join(corpora)}: checkpoint in {out}")
        if args.json:
            print(json.dumps(summary, default=str))
    if acc is not None:
        acc.wait_for_everyone()
    return 0


def cmd_eval(args) -> int:
    from attacks.base import read_config
    from attacks.cli import quiet_datasets
    from attacks.evaluate import flat_report, prior_tokens, score
    from attacks.defended import as_public, defend_taps, victim_model
    from attacks.registry import load_attack
    from attacks.tapdata import as_taps
    from splitinfer.defenses.cli_args import defense_from_args
    from attacks.taps import Boundary, extract_corpora, parse_corpora
    from splitinfer.cli import load_for_cli

    quiet_datasets()
    cfg = read_config(args.attacker)
    meta = cfg.get("meta", {})
    args.model = args.model or meta.get("model")
    if not args.model:
        raise AttackError(f"checkpoint {args.attacker} records no model; pass --model")
    loaded = load_for_cli(args)
    attack = load_attack(args.attacker, model=loaded)
    boundary = args.boundary or meta.get("boundary")
    if not boundary:
        raise AttackError(f"attack {attack.name!r} has no fixed boundary; pass --boundary (e.g. head:4)")
    b = Boundary.parse(boundary)
    b.validate(loaded.num_layers)
    corpora = parse_corpora(args.corpus)
    split = args.split or (None if not _val_split_ok(corpora) else "test")
    defense = defense_from_args(args)  # the victim: private local layers, then the wire defense
    sets = extract_corpora(victim_model(loaded, defense, b.depth(loaded.num_layers)), corpora, b, split,
                           max_tokens=args.max_tokens,
                           max_length=args.max_length or meta.get("max_length") or 256, seed=args.seed,
                           progress=not args.json)
    taps = defend_taps(as_public(as_taps(sets), loaded), defense)
    extra = {"defense": defense.label, "attack": attack.name, "threat_model": attack.threat_model,
             "boundary": str(b), "model": loaded.spec,
             "model_sha256": loaded.sha256, "corpus": corpora, "split": split, "attacker": str(args.attacker)}
    if attack.name == "depth-id":
        pred = attack.identify(taps)
        true = taps.meta.get("depth")
        report = {"depth": true, "depth_token_acc": float((pred["token_depth"] == true).mean()),
                  "depth_sequence_acc": float((pred["sequence_depth"] == true).mean()),
                  "n_tokens": taps.n_tokens, "n_sequences": len(taps), **extra}
        print(f"depth-id on {b} (depth {true}): token acc {report['depth_token_acc']:.3f}, "
              f"sequence acc {report['depth_sequence_acc']:.3f}")
    else:
        inv = attack.invert(taps)
        summary = score(inv, taps, vocab_size=int(loaded.config.vocab_size),
                        train_token_ids=prior_tokens(meta["unigram_top"]) if meta.get("unigram_top") else None)
        report = flat_report(summary, **extra, info=inv.info)
        print(f"{attack.name} at {b} on {','.join(corpora)} ({report['n_tokens']} tokens, "
              f"{report['n_documents']} documents)")
        for key, v in summary.items():
            ci = "" if v["ci_low"] is None else f"  [{v['ci_low']:.3f}, {v['ci_high']:.3f}]"
            print(f"  {key:<28} {v['value']:.4f}{ci}  n={v['n']}")
    if args.json:
        print(json.dumps(report, default=str))
    return 0


def cmd_list(args) -> int:
    from attacks.registry import list_attacks

    rows = list_attacks()
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'attack':<14} {'threat model':<12} {'side':<5} {'requires':<28} description")
    for r in rows:
        print(f"{r['name']:<14} {r['threat_model']:<12} {r['boundary_side']:<5} {','.join(r['requires']):<28} "
              f"{r['summary']}")
    return 0


def add_parsers(asub, positive) -> None:
    """Register ``train``, ``eval`` and ``list`` on the ``attack`` subparsers (called from attacks.cli)."""
    from splitinfer.cli import add_model_args
    from splitinfer.defenses.cli_args import add_defense_args

    t = asub.add_parser("train", help="train an inversion attacker on corpus taps; checkpoint as safetensors + JSON")
    add_model_args(t, split_default=None)
    t.add_argument("--attack", required=True, help="recipe name (see `splitinfer attack list`)")
    t.add_argument("--boundary", required=True, help="head:A or tail:B (depth-id: several, comma-separated)")
    t.add_argument("--corpus", required=True, help="comma-separated corpora: prose,code,chat,pii, file:PATH, hf:...")
    t.add_argument("--split", default=None, choices=["train", "val", "test", "all"],
                   help="training split (default: train for built-in corpora, all for file:/hf:)")
    t.add_argument("--max-tokens", type=positive, default=200_000,
                   help="training tokens in total (default %(default)s)")
    t.add_argument("--val-tokens", type=int, default=20_000, help="validation tokens from the val split of "
                   "built-in corpora, for early stopping / model selection; 0 disables (default %(default)s)")
    t.add_argument("--max-length", type=positive, default=256, help="tokens per sequence (default %(default)s)")
    t.add_argument("--extract-batch-size", type=positive, default=4)
    t.add_argument("--epochs", type=positive, default=None)
    t.add_argument("--lr", type=float, default=None)
    t.add_argument("--batch-size", type=positive, default=None)
    t.add_argument("--hparam", action="append", metavar="KEY=VALUE", help="recipe hyper-parameter (repeatable), "
                   "e.g. --hparam protocol=seed --hparam width=1024")
    t.add_argument("--seed", type=int, default=0, help="seed of the corpus split, initialisation and shuffling")
    t.add_argument("--out", required=True, help="checkpoint directory")
    t.add_argument("--no-resume", action="store_true", help="ignore training checkpoints under OUT/checkpoints")
    t.add_argument("--json", action="store_true", help="no progress bars; print a JSON summary as the last line")
    add_defense_args(t)
    t.set_defaults(func=cmd_train)

    e = asub.add_parser("eval", help="score a trained attacker on a corpus (token accuracy, F1, exact match, PII)")
    add_model_args(e, split_default=None)
    e.set_defaults(model=None)
    e.add_argument("--attacker", required=True, help="checkpoint directory written by `attack train`")
    e.add_argument("--corpus", required=True, help="comma-separated corpora, e.g. file:PATH or pii")
    e.add_argument("--split", default=None, choices=["train", "val", "test", "all"],
                   help="default: test for built-in corpora, all for file:/hf:")
    e.add_argument("--boundary", default=None, help="override the checkpoint's boundary (needed for depth-id)")
    e.add_argument("--max-tokens", type=positive, default=50_000, help="tokens scored in total (default %(default)s)")
    e.add_argument("--max-length", type=positive, default=None, help="default: the checkpoint's training value")
    e.add_argument("--seed", type=int, default=0, help="corpus split seed")
    e.add_argument("--json", action="store_true", help="no progress bars; print one JSON object as the last line")
    add_defense_args(e)
    e.set_defaults(func=cmd_eval)

    ls = asub.add_parser("list", help="list attack recipes and their threat models")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)


if __name__ == "__main__":  # pragma: no cover - `python -m attacks.train attack train ...` (accelerate launch -m)
    from splitinfer.cli import main

    sys.exit(main(sys.argv[1:]))
