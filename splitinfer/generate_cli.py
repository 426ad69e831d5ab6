"""``splitinfer generate``, ``draft-calibrate`` and ``draft-train``: the runtime's own commands.

Each command turns its parsed flags into frozen configs (:mod:`splitinfer.cli_flags`) first
and hands only those to the runtime. :func:`register` mounts the three on the ``splitinfer``
parser (composed in :mod:`splitinfer.cli`).
"""

from __future__ import annotations

import json
import sys

from splitinfer.cli_flags import (
    LinkFlags,
    ModelFlags,
    add_deprecated,
    add_link_args,
    add_model_args,
    add_wire_dtype,
    finite_float,
    name_list,
    positive_int,
)


def cmd_generate(args) -> int:
    from splitinfer import batch_invariant
    from splitinfer.client import SplitModel
    from splitinfer.cloud_cli import CloudFlags
    from splitinfer.decoding.cli_args import DecodingFlags
    from splitinfer.defenses.cli_args import DefenseFlags

    model, link = ModelFlags.from_args(args), LinkFlags.from_args(args)
    decoding = DecodingFlags.from_args(args)
    loaded = model.load()
    wan = link.wan(seed=model.seed)
    sm = SplitModel(loaded, args.split, cloud=CloudFlags.from_args(args).link(wan), wan=wan,
                    wire_dtype=link.wire_dtype, defense=DefenseFlags.from_args(args).pipeline(fresh_secrets=True))
    stream_to = sys.stderr if args.json else sys.stdout
    res = sm.generate(
        args.prompt,
        args.max_new_tokens,
        chat=args.chat,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=model.seed,
        decoding=decoding.name,
        decoding_options=decoding.options,
        on_text=lambda t: (stream_to.write(t), stream_to.flush()),
    )
    stream_to.write("\n")
    s = res.summary()
    b = s["breakdown_ms"]
    print(
        f"[{s['new_tokens']} tokens in {s['steps']} steps, {s['tokens_per_step']:.2f} tok/step, "
        f"{s['tok_s']:.2f} tok/s ({s['modelled_tok_s']:.2f} modelled), draft acceptance "
        f"{s['draft_acceptance_rate']:.2f}; sent {s['bytes_sent']} B, received {s['bytes_received']} B; per step ms: "
        + ", ".join(f"{k[:-3]} {v:.2f}" for k, v in b.items())
        + "]",
        file=sys.stderr,
    )
    if args.json:
        print(json.dumps({**s, "model": loaded.spec, "model_sha256": loaded.sha256, "split": str(sm.split),
                          "rtt_ms": link.rtt_ms, "bandwidth_mbps": link.bandwidth_mbps,
                          "wire_dtype": sm.wire_dtype_name, "defense_detail": sm.defense.describe(),
                          "kernels": batch_invariant.kernels(loaded.model)}))
    return 0


def cmd_draft_calibrate(args) -> int:
    from splitinfer.client import SplitModel
    from splitinfer.decoding.bridge import calibrate, corpus_sequences, split_meta

    sm = SplitModel(ModelFlags.from_args(args).load(), args.split, wire_dtype=args.wire_dtype)
    seqs = corpus_sequences(sm.loaded.tokenizer, list(args.corpus), args.max_tokens, args.seq_len)
    bridge = calibrate(sm, seqs, ridge=args.ridge)
    path = bridge.save(args.out, {**split_meta(sm), "corpora": ",".join(args.corpus), "wire_dtype": sm.wire_dtype_name},
                       force=args.force)
    print(f"bridge calibration ({bridge.n} state pairs from {len(seqs)} sequences) written to {path}; "
          f"use it with --decoding local-draft --draft-calibration {args.out}")
    return 0


def cmd_draft_train(args) -> int:
    from splitinfer.decoding.feature_head import default_dir, save_head
    from splitinfer.decoding.feature_train import draft_train, read_prompt_file

    model = ModelFlags.from_args(args)
    loaded = model.load()
    head, meta = draft_train(loaded, tokens=args.train_tokens, seed=model.seed, hidden=args.hidden,
                             unroll=args.unroll, steps=args.steps, batch=args.batch, max_new=args.max_new_tokens,
                             prompt_chars=args.prompt_chars, gen_batch=args.gen_batch, vocab=args.vocab,
                             prompt_texts=read_prompt_file(args.prompts_file) if args.prompts_file else None)
    out = args.out or default_dir(loaded.sha256 or "")
    path = save_head(head, out, meta, force=args.force)
    h = meta["heldout"]
    print(f"feature-draft head ({meta['generated_tokens']} greedy tokens from {meta['prompts']} prompts, "
          f"{meta['steps']} steps, {meta['timings_s']['total_s']:.0f} s, draft vocabulary {meta['draft_vocab']}"
          + ("" if meta["draft_vocab_coverage"] is None else
             f" covering {100 * meta['draft_vocab_coverage']:.1f}% of held-out generated tokens")
          + f") written to {path}; held-out top-1 per depth "
          f"{h['top1_per_depth']}, chain {h['chain_per_depth']}; use it with --decoding feature-draft"
          + ("" if args.out is None else f" --draft-head {out}"))
    return 0


def register(sub) -> None:
    """Mount ``generate``, ``draft-calibrate`` and ``draft-train`` on the ``splitinfer`` sub-command parser."""
    from splitinfer.cloud_cli import add_cloud_args
    from splitinfer.decoding.cli_args import add_decoding_args
    from splitinfer.defenses.cli_args import add_defense_args

    g = sub.add_parser("generate", help="generate text with the model split across a (emulated) cloud")
    add_model_args(g)
    add_link_args(g)
    add_cloud_args(g)
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--temperature", type=finite_float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-p", type=finite_float, default=1.0)
    g.add_argument("--json", action="store_true", help="print a JSON summary as the last line of stdout")
    add_decoding_args(g)
    add_defense_args(g)
    g.add_argument("prompt")
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("draft-calibrate", help="fit local-draft's bridge (head -> body states) on a corpus, once")
    add_model_args(c)
    c.add_argument("--corpus", type=name_list, default="chat,code,prose",
                   help="comma list of corpora (train split; default %(default)s)")
    c.add_argument("--max-tokens", type=int, default=16000, help="tokens in all (default %(default)s)")
    c.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (default %(default)s)")
    c.add_argument("--ridge", type=finite_float, default=30.0, help="ridge penalty in samples (default %(default)s)")
    add_wire_dtype(c)
    c.add_argument("--out", required=True, help="output path: writes OUT.safetensors and OUT.json")
    c.add_argument("--force", action="store_true", help="overwrite OUT even if it holds a different calibration")
    c.set_defaults(func=cmd_draft_calibrate)

    t = sub.add_parser("draft-train", help="train feature-draft's head on the model's own greedy continuations, once")
    add_model_args(t, split_default=None)
    t.add_argument("--out", default=None,
                   help="output directory (default: the splitinfer cache, where --decoding feature-draft looks)")
    t.add_argument("--force", action="store_true", help="overwrite a head of a different run in the output directory")
    t.add_argument("--train-tokens", type=int, default=12000,
                   help="greedy tokens to generate and train on (default %(default)s)")
    add_deprecated(t, "--tokens", "--train-tokens", "train_tokens", type=int)
    t.add_argument("--steps", type=int, default=400, help="optimizer steps (default %(default)s)")
    t.add_argument("--batch", type=int, default=128, help="windows per step (default %(default)s)")
    t.add_argument("--unroll", type=int, default=4, help="depths unrolled on own features (default %(default)s)")
    t.add_argument("--hidden", type=int, default=1024, help="MLP width (default %(default)s)")
    t.add_argument("--vocab", type=int, default=8192,
                   help="draft vocabulary: the N tokens the model emits most (FR-Spec); 0 = all (default %(default)s)")
    t.add_argument("--max-new-tokens", type=positive_int, default=128,
                   help="continuation length per prompt (default %(default)s)")
    t.add_argument("--prompt-chars", type=positive_int, default=600,
                   help="max corpus snippet per prompt (default %(default)s)")
    t.add_argument("--prompts-file", default=None,
                   help="JSONL of {\"text\": ...} user messages to continue instead of corpus snippets")
    t.add_argument("--gen-batch", type=positive_int, default=16,
                   help="prompts generated at once (default %(default)s; raise it on a GPU)")
    t.set_defaults(func=cmd_draft_train)
