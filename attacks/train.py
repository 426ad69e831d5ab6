"""``splitinfer attack train | eval | list``: train an attacker on corpus taps, score it on any corpus, list recipes.

``train`` extracts (or reuses cached) taps with :func:`attacks.taps.extract_corpora`
for the train split (and the val split of built-in corpora), fits the recipe
and writes the checkpoint (``config.json`` + ``attack.safetensors``) to
``--out``; gradient-trained recipes also write per-epoch training checkpoints
under ``--out/checkpoints`` and resume from them. Under ``accelerate launch
--num_processes N -m splitinfer.cli attack train ...`` the main process extracts
first (the others then read the cache), training runs as DDP, and only the main
process writes.

``eval`` loads a checkpoint with the model it records (checking the sha256),
extracts the corpus at the checkpoint's boundary, inverts and scores; with
``--json`` the last line is one JSON object (see :func:`attacks.evaluate.flat_report`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from attacks.errors import AttackError
from splitinfer.cli_flags import (
    ModelFlags,
    add_deprecated,
    add_model_args,
    add_subset,
    finite_float,
    parse_options,
    positive_int,
    quiet_datasets,
)
from splitinfer.errors import SplitInferError

log = logging.getLogger(__name__)


def _val_split_ok(corpora: list[str]) -> bool:
    return all(":" not in c for c in corpora)


def cmd_train(args) -> int:
    from attacks.base import DepthIdentifier
    from attacks.registry import get_attack_class
    from attacks.defended import attacker_view, defend_taps
    from attacks.tapdata import as_taps
    from attacks.taps import extract_corpora, parse_corpora
    from attacks.trainer import TrainConfig, get_accelerator
    from splitinfer.defenses.cli_args import DefenseFlags

    quiet_datasets()
    klass = get_attack_class(args.attack)
    hparams = attack_options(args.attack_option)
    shortcuts = {"epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size}
    hparams.update({k: v for k, v in shortcuts.items() if v is not None and k in klass.defaults})
    corpora = parse_corpora(args.corpus)
    defense = DefenseFlags.from_args(args).pipeline()  # the victim's, as the attacker knows it
    boundaries = args.boundary
    where = ",".join(map(str, boundaries))
    depth_id = issubclass(klass, DepthIdentifier)
    if len(boundaries) > 1 and not depth_id:
        raise AttackError(f"attack {klass.name!r} trains at one boundary; got {len(boundaries)}: {where}")
    out = Path(args.out)
    blocked = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocked is not None:  # found now, not after minutes of extraction
        raise AttackError(f"--out {out}: {blocked} is a file; give a directory path for the checkpoint")
    acc = get_accelerator()
    main = acc is None or acc.is_main_process
    model = ModelFlags.from_args(args)
    loaded = model.load()
    for b in boundaries:
        b.validate(loaded.num_layers)
    attack = klass(model=loaded, seed=model.seed, **hparams)  # bad options fail here, before any extraction
    extract = dict(max_length=args.max_length, batch_size=args.extract_batch_size, seed=model.seed,
                   progress=main and not args.json)
    first = acc.main_process_first() if acc is not None else contextlib.nullcontext()
    with first:  # the main process extracts, the others then hit the cache
        train = {b: extract_corpora(loaded, corpora, b, args.subset, max_tokens=args.max_tokens, **extract)
                 for b in boundaries}
        val = None
        if args.val_tokens and _val_split_ok(corpora) and args.subset in (None, "train"):
            val = {b: extract_corpora(loaded, corpora, b, "val", max_tokens=args.val_tokens, **extract)
                   for b in boundaries}
    own = attacker_view(defense)  # adaptive: trains on its own defended pairs (public weights)
    train = {k: defend_taps(as_taps(v), own) for k, v in train.items()} if not own.is_none else train
    val = {k: defend_taps(as_taps(v), own) for k, v in val.items()} if val and not own.is_none else val
    trainer = TrainConfig(checkpoint_dir=str(out / "checkpoints"), resume=not args.no_resume,
                          progress=main and not args.json)
    if depth_id:
        attack.fit(list(train.values()), trainer=trainer)
    else:
        b = boundaries[0]
        attack.fit(train[b], None if val is None else val[b], trainer=trainer)
    attack.meta.update(max_length=args.max_length, corpora=corpora, train_max_tokens=args.max_tokens,
                       defense=defense.label)
    if main:
        attack.save(out, force=args.force)
        summary = {"attack": attack.name, "threat_model": attack.threat_model, "out": str(out),
                   "boundary": attack.meta.get("boundary"), "model": loaded.spec, "model_sha256": loaded.sha256,
                   "train_tokens": attack.meta.get("train_tokens"), "fit_report": attack.fit_report}
        print(f"trained {attack.name} at {where} on {','.join(corpora)}: checkpoint in {out}")
        if args.json:
            print(json.dumps(summary, default=str))
    if acc is not None:
        acc.wait_for_everyone()
    return 0


def cmd_eval(args) -> int:
    from attacks.base import DepthIdentifier, read_config
    from attacks.evaluate import collect, flat_report, prior_tokens
    from attacks.metrics.baselines import prior_from_json
    from attacks.predictions import write_predictions
    from attacks.defended import as_public, defend_taps, show_cloud, threat_label, victim_model
    from attacks.registry import load_attack
    from attacks.tapdata import as_taps
    from splitinfer.defenses.cli_args import DefenseFlags
    from attacks.boundary import Boundary
    from attacks.taps import extract_corpora, parse_corpora

    quiet_datasets()
    cfg = read_config(args.attacker)
    meta = cfg.get("meta", {})
    model = ModelFlags.from_args(args)
    if not model.model and not meta.get("model"):
        raise AttackError(f"checkpoint {args.attacker} records no model; pass --model")
    model = replace(model, model=model.model or meta["model"])
    loaded = model.load()
    attack = load_attack(args.attacker, model=loaded)
    if args.boundary is not None and len(args.boundary) != 1:
        raise AttackError(f"eval scores at one boundary; got {len(args.boundary)}")
    b = args.boundary[0] if args.boundary else (Boundary.parse(meta["boundary"]) if meta.get("boundary") else None)
    if b is None:
        raise AttackError(f"attack {attack.name!r} has no fixed boundary; pass --boundary (e.g. head:4)")
    b.validate(loaded.num_layers)
    corpora = parse_corpora(args.corpus)
    split = args.subset or (None if not _val_split_ok(corpora) else "test")
    defense = DefenseFlags.from_args(args).pipeline()  # the victim: private local layers, then the wire defense
    sets = extract_corpora(victim_model(loaded, defense, b.depth(loaded.num_layers)), corpora, b, split,
                           max_tokens=args.max_tokens,
                           max_length=args.max_length or meta.get("max_length") or 256, seed=model.seed,
                           progress=not args.json)
    taps = defend_taps(as_public(as_taps(sets), loaded), defense)
    show_cloud(attack, loaded, defense, b.depth(loaded.num_layers))  # permute: the cloud's transformed weights
    adaptive = bool(getattr(attack, "adaptive", False)) or meta.get("defense", "none") != "none"
    extra = {"defense": defense.label, "attack": attack.name,
             "threat_model": threat_label(attack.threat_model, defense, adaptive),
             "boundary": str(b), "model": loaded.spec,
             "model_sha256": loaded.sha256, "corpus": corpora, "split": split, "attacker": str(args.attacker)}
    if isinstance(attack, DepthIdentifier):
        acc = attack.accuracy(taps)
        true = acc["depth"]
        report = {"depth": true, "depth_token_acc": acc["token_acc"], "depth_sequence_acc": acc["sequence_acc"],
                  "n_tokens": acc["n_tokens"], "n_sequences": acc["sequences"], **extra}
        print(f"{attack.name} on {b} (depth {true}): token acc {report['depth_token_acc']:.3f}, "
              f"sequence acc {report['depth_sequence_acc']:.3f}")
    else:
        inv = attack.invert(taps)
        if attack.reads == "next":  # its guess at row t is token t+1: score it against the following tokens
            from attacks.base import Inversion
            from attacks.recipes._common import next_token_rows

            rows, taps = next_token_rows(taps)
            inv = Inversion(inv.tokens[rows], inv.topk[rows], inv.scores[rows], inv.info)
        prior = prior_from_json(meta["token_prior"]) if meta.get("token_prior") else None
        pred = collect(inv, taps, vocab_size=int(loaded.config.vocab_size), prior=prior, meta=extra,
                       train_token_ids=prior_tokens(meta["unigram_top"]) if meta.get("unigram_top") else None)
        summary = pred.summarize()
        names = "_".join(c.replace("/", "_").replace(":", "-") for c in corpora)
        out = Path(args.predictions) if args.predictions else \
            Path(args.attacker) / f"predictions-{names}-{split or 'default'}.jsonl.gz"
        report = flat_report(summary, **extra, info=inv.info, predictions=str(write_predictions(out, pred)))
        print(f"{attack.name} at {b} on {','.join(corpora)} ({report['n_tokens']} tokens, "
              f"{report['n_documents']} documents)")
        for key, v in summary.items():
            ci = "  [n/a]" if v["ci_low"] is None else f"  [{v['ci_low']:.3f}, {v['ci_high']:.3f}]"
            print(f"  {key:<28} {v['value']:.4f}{ci}  n={v['n']}")
    if args.json:
        print(json.dumps(report, default=str))
    return 0


def _rescore_dir(args) -> int:
    from attacks.predictions import rescore_dir

    recs = rescore_dir(args.path)
    bad = [r for r in recs if r["mismatches"] or r["missing"]]
    for r in recs:
        state = ("run missing from the results" if r["missing"] else "size-capped: not compared" if not r["complete"]
                 else f"{len(r['mismatches'])} of {r['metrics']} metrics differ ({', '.join(r['mismatches'])})"
                 if r["mismatches"] else f"{r['metrics']} metrics reproduced exactly")
        print(f"  {r['run']:<44} {state}")
    print(f"{args.path}: {len(recs)} predictions files, {len(recs) - len(bad)} reproduce the results document")
    if args.json:
        print(json.dumps(recs))
    return 1 if bad else 0


def cmd_rescore(args) -> int:
    from pathlib import Path

    from attacks.evaluate import flat_report
    from attacks.predictions import rescore

    if Path(args.path).is_dir():
        return _rescore_dir(args)
    summary, pred = rescore(args.path)
    scope = "" if pred.complete else f" (size cap: {len(pred.doc_ids)} of {pred.n_documents_total} documents)"
    print(f"{args.path}: {sum(len(t) for t in pred.true)} tokens, {len(pred.doc_ids)} documents{scope}; "
          "user text unless prefixed template_")
    for key, v in summary.items():
        ci = "  [n/a]" if v["ci_low"] is None else f"  [{v['ci_low']:.3f}, {v['ci_high']:.3f}]"
        print(f"  {key:<36} {v['value']:.4f}{ci}  n={v['n']}")
    if args.json:
        print(json.dumps(flat_report(summary, **pred.meta, complete=pred.complete), default=str))
    return 0


def cmd_compare(args) -> int:
    from attacks.compare import compare

    c = compare(args.a, args.b)
    scope = "" if c["complete"] else " (size-capped files: the documents they keep)"
    print(f"A {c['a']['run']}: {100 * c['a']['token_acc_top1']:.1f}% top-1")
    print(f"B {c['b']['run']}: {100 * c['b']['token_acc_top1']:.1f}% top-1")
    if c["ci_low"] is None:
        ci = " (no interval below 2 documents)"
    else:
        ci = (f" [{100 * c['ci_low']:+.1f}, {100 * c['ci_high']:+.1f}], paired over documents; "
              + ("the interval excludes 0" if c["significant"] else "the interval includes 0: no difference shown"))
    print(f"A - B: {100 * c['diff']:+.1f} points{ci} ({c['n_tokens']:,} user-text tokens, "
          f"{c['n_documents']} documents{scope})")
    if args.json:
        print(json.dumps(c))
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


def boundary_list(text: str) -> tuple:
    """argparse type: ``head:2,tail:2`` -> Boundaries, parsed once here (one-line error when bad)."""
    import argparse

    from attacks.errors import AttackError
    from attacks.boundary import Boundary

    try:
        out = tuple(Boundary.parse(b) for b in text.split(",") if b.strip())
    except AttackError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not out:
        raise argparse.ArgumentTypeError("no boundary given; name one or more, e.g. --boundary head:2,tail:2")
    return out


def add_tap_args(p, boundary_help: str, tokens_help: str) -> None:
    """``--corpus``, ``--boundary`` (parsed once, into Boundaries), ``--subset`` and ``--max-tokens``."""
    p.add_argument("--corpus", required=True, help="comma-separated corpora: prose,code,chat,pii, file:PATH, hf:...")
    p.add_argument("--boundary", required=True, type=boundary_list, help=boundary_help)
    add_subset(p, "train for built-in corpora, all for file:/hf:")
    p.add_argument("--max-tokens", type=positive_int, default=200_000, help=f"{tokens_help} (default %(default)s)")


def attack_options(items: list[str] | None) -> dict[str, Any]:
    """``--attack-option KEY=VALUE`` items -> the recipe's hyper-parameters (JSON scalars where they parse)."""
    try:
        return parse_options(items, "--attack-option", "epochs=3")
    except SplitInferError as e:
        raise AttackError(str(e)) from None


def add_parsers(asub) -> None:
    """Register ``train``, ``eval`` and ``list`` on the ``attack`` subparsers (called from attacks.cli)."""
    from splitinfer.defenses.cli_args import add_defense_args

    t = asub.add_parser("train", help="train an inversion attacker on corpus taps; checkpoint as safetensors + JSON")
    add_model_args(t, split_default=None)
    t.add_argument("--attack", required=True, help="recipe name (see `splitinfer attack list`)")
    add_tap_args(t, "head:A or tail:B (depth-id: several, comma-separated)", "training tokens in total")
    t.add_argument("--val-tokens", type=int, default=20_000, help="validation tokens from the val split of "
                   "built-in corpora, for early stopping / model selection; 0 disables (default %(default)s)")
    t.add_argument("--max-length", type=positive_int, default=256, help="tokens per sequence (default %(default)s)")
    t.add_argument("--extract-batch-size", type=positive_int, default=4)
    t.add_argument("--epochs", type=positive_int, default=None)
    t.add_argument("--lr", type=finite_float, default=None)
    t.add_argument("--batch-size", type=positive_int, default=None)
    t.add_argument("--attack-option", action="append", default=[], metavar="KEY=VALUE",
                   help="recipe hyper-parameter (repeatable), e.g. --attack-option protocol=seed "
                        "--attack-option width=1024")
    add_deprecated(t, "--hparam", "--attack-option", "attack_option", append=True)
    t.add_argument("--out", required=True, help="checkpoint directory")
    t.add_argument("--no-resume", action="store_true", help="ignore training checkpoints under OUT/checkpoints")
    t.add_argument("--force", action="store_true", help="overwrite OUT even if it holds a different run's checkpoint")
    t.add_argument("--json", action="store_true", help="no progress bars; print a JSON summary as the last line")
    add_defense_args(t)
    t.set_defaults(func=cmd_train)

    e = asub.add_parser("eval", help="score a trained attacker on a corpus (token accuracy, F1, exact match, PII)")
    add_model_args(e, split_default=None)
    e.set_defaults(model=None)
    e.add_argument("--attacker", required=True, help="checkpoint directory written by `attack train`")
    e.add_argument("--corpus", required=True, help="comma-separated corpora, e.g. file:PATH or pii")
    add_subset(e, "test for built-in corpora, all for file:/hf:")
    e.add_argument("--boundary", default=None, type=boundary_list,
                   help="override the checkpoint's boundary (needed for depth-id)")
    e.add_argument("--max-tokens", type=positive_int, default=50_000,
                   help="tokens scored in total (default %(default)s)")
    e.add_argument("--max-length", type=positive_int, default=None, help="default: the checkpoint's training value")
    e.add_argument("--predictions", default=None, metavar="PATH", help="per-token predictions (gzipped JSON lines) "
                   "for `attack rescore`; default: ATTACKER/predictions-<corpus>-<split>.jsonl.gz")
    e.add_argument("--json", action="store_true", help="no progress bars; print one JSON object as the last line")
    add_defense_args(e)
    e.set_defaults(func=cmd_eval)

    r = asub.add_parser("rescore", help="recompute every metric from a per-token predictions file, without rerunning")
    r.add_argument("path", help="a *.jsonl.gz written by `attack eval`, the attack stage or the depth study; or "
                   "an output directory (a suite run, `bench attacks`): every file there is rescored and compared "
                   "with its results document (exit 1 on any difference)")
    r.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    r.set_defaults(func=cmd_rescore)

    c = asub.add_parser("compare", help="A minus B top-1 recovery on one scored set, paired over documents, from "
                        "two predictions files")
    c.add_argument("a", help="a *.jsonl.gz predictions file (e.g. a grid cell's attacker under one defense)")
    c.add_argument("b", help="a predictions file scored on the same tokens (another attacker or defense of the "
                   "same grid at the same head depth)")
    c.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    c.set_defaults(func=cmd_compare)

    ls = asub.add_parser("list", help="list attack recipes and their threat models")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)
