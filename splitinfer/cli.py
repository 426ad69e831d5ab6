"""The ``splitinfer`` command: ``generate``, and the ``bench`` / ``attack`` groups.

Each package owns its sub-commands: this module mounts the runtime's own
(``generate``) and calls ``register(subparsers)`` of ``benchmarks.cli`` and
``attacks.cli``. Errors the user can fix print one line (``splitinfer:
error: ...``) and exit with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from splitinfer.errors import SplitInferError

log = logging.getLogger("splitinfer")


def add_model_args(p: argparse.ArgumentParser, split_default: str | None = "2,2") -> None:
    """Flags shared by every command that loads a model."""
    p.add_argument("--model", default="default", help="default | gemma3-270m | tiny-random | DIR | FILE.gguf | org/name")
    if split_default is not None:
        p.add_argument("--split", default=split_default, help="HEAD,TAIL local layer counts (default %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default %(default)s)")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"], help="compute dtype")
    p.add_argument("--batch-invariant", action="store_true",
                   help="batch-invariant kernels: a token's logits do not depend on how many tokens share its "
                        "forward, so speculative decoding matches sequential bit for bit (slower; a cloud "
                        "server must use it too)")


def add_link_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rtt-ms", type=float, default=0.0, help="emulated round-trip time in ms")
    p.add_argument("--bandwidth-mbps", type=float, default=None, help="emulated bandwidth in Mbit/s (default unlimited)")
    p.add_argument("--jitter-ms", type=float, default=0.0, help="std-dev of emulated RTT jitter in ms (seeded)")
    p.add_argument("--wire-dtype", default="fp16", choices=["fp16", "fp32", "bf16"], help="hidden-state dtype on the wire")


def quiet_libraries() -> None:
    """Keep third-party progress bars and warnings off the user's terminal."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass


def load_for_cli(args):
    from splitinfer.models import load_model

    log.info("loading model %s", args.model)
    return load_model(args.model, dtype=args.dtype, device=args.device, seed=getattr(args, "seed", 0),
                      batch_invariant=getattr(args, "batch_invariant", False))


def cmd_generate(args) -> int:
    from splitinfer import batch_invariant
    from splitinfer.client import SplitModel
    from splitinfer.cloud_cli import cloud_link
    from splitinfer.decoding.cli_args import decoding_options
    from splitinfer.defenses.cli_args import defense_from_args
    from splitinfer.link import WanProfile

    loaded = load_for_cli(args)
    wan = WanProfile(rtt_ms=args.rtt_ms, bandwidth_mbps=args.bandwidth_mbps, jitter_ms=args.jitter_ms, seed=args.seed)
    sm = SplitModel(loaded, args.split, cloud=cloud_link(args, wan), wan=wan, wire_dtype=args.wire_dtype,
                    defense=defense_from_args(args))
    stream_to = sys.stderr if args.json else sys.stdout
    res = sm.generate(
        args.prompt,
        args.max_new_tokens,
        chat=args.chat,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        decoding=args.decoding,
        decoding_options=decoding_options(args),
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
                          "rtt_ms": args.rtt_ms, "bandwidth_mbps": args.bandwidth_mbps,
                          "wire_dtype": args.wire_dtype, "defense_detail": sm.defense.describe(),
                          "kernels": batch_invariant.kernels(loaded.model)}))
    return 0


def cmd_draft_calibrate(args) -> int:
    from splitinfer.client import SplitModel
    from splitinfer.decoding.bridge import calibrate, corpus_sequences, split_meta

    sm = SplitModel(load_for_cli(args), args.split, wire_dtype=args.wire_dtype)
    seqs = corpus_sequences(sm.loaded.tokenizer, [c for c in args.corpus.split(",") if c], args.max_tokens,
                            args.seq_len)
    bridge = calibrate(sm, seqs, ridge=args.ridge)
    path = bridge.save(args.out, {**split_meta(sm), "corpora": args.corpus, "wire_dtype": args.wire_dtype})
    print(f"bridge calibration ({bridge.n} state pairs from {len(seqs)} sequences) written to {path}; "
          f"use it with --decoding local-draft --draft-calibration {args.out}")
    return 0


def cmd_draft_train(args) -> int:
    from splitinfer.decoding.feature_head import default_dir, save_head
    from splitinfer.decoding.feature_train import draft_train, read_prompt_file

    loaded = load_for_cli(args)
    head, meta = draft_train(loaded, tokens=args.tokens, seed=args.seed, hidden=args.hidden, unroll=args.unroll,
                             steps=args.steps, batch=args.batch, max_new=args.max_new_tokens,
                             prompt_chars=args.prompt_chars, gen_batch=args.gen_batch, vocab=args.vocab,
                             prompt_texts=read_prompt_file(args.prompts_file) if args.prompts_file else None)
    out = args.out or default_dir(loaded.sha256 or "")
    path = save_head(head, out, meta)
    h = meta["heldout"]
    print(f"feature-draft head ({meta['generated_tokens']} greedy tokens from {meta['prompts']} prompts, "
          f"{meta['steps']} steps, {meta['timings_s']['total_s']:.0f} s, draft vocabulary {meta['draft_vocab']}"
          + ("" if meta["draft_vocab_coverage"] is None else
             f" covering {100 * meta['draft_vocab_coverage']:.1f}% of held-out generated tokens")
          + f") written to {path}; held-out top-1 per depth "
          f"{h['top1_per_depth']}, chain {h['chain_per_depth']}; use it with --decoding feature-draft"
          + ("" if args.out is None else f" --draft-head {out}"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="splitinfer", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    from splitinfer.cloud_cli import add_cloud_args
    from splitinfer.cloud_cli import register as register_cloud
    from splitinfer.decoding.cli_args import add_decoding_args
    from splitinfer.defenses.cli_args import add_defense_args

    g = sub.add_parser("generate", help="generate text with the model split across a (emulated) cloud")
    add_model_args(g)
    add_link_args(g)
    add_cloud_args(g)
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--json", action="store_true", help="print a JSON summary as the last line of stdout")
    add_decoding_args(g)
    add_defense_args(g)
    g.add_argument("prompt")
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("draft-calibrate", help="fit local-draft's bridge (head -> body states) on a corpus, once")
    add_model_args(c)
    c.add_argument("--corpus", default="chat,code,prose",
                   help="comma list of corpora (train split; default %(default)s)")
    c.add_argument("--max-tokens", type=int, default=16000, help="tokens in all (default %(default)s)")
    c.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (default %(default)s)")
    c.add_argument("--ridge", type=float, default=30.0, help="ridge penalty in samples (default %(default)s)")
    c.add_argument("--wire-dtype", default="fp16", choices=["fp16", "fp32", "bf16"],
                   help="hidden-state dtype on the wire")
    c.add_argument("--out", required=True, help="output path: writes OUT.safetensors and OUT.json")
    c.set_defaults(func=cmd_draft_calibrate)

    t = sub.add_parser("draft-train", help="train feature-draft's head on the model's own greedy continuations, once")
    add_model_args(t, split_default=None)
    t.add_argument("--out", default=None,
                   help="output directory (default: the splitinfer cache, where --decoding feature-draft looks)")
    t.add_argument("--tokens", type=int, default=12000, help="greedy tokens to generate (default %(default)s)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--steps", type=int, default=400, help="optimizer steps (default %(default)s)")
    t.add_argument("--batch", type=int, default=128, help="windows per step (default %(default)s)")
    t.add_argument("--unroll", type=int, default=4, help="depths unrolled on own features (default %(default)s)")
    t.add_argument("--hidden", type=int, default=1024, help="MLP width (default %(default)s)")
    t.add_argument("--vocab", type=int, default=8192,
                   help="draft vocabulary: the N tokens the model emits most (FR-Spec); 0 = all (default %(default)s)")
    t.add_argument("--max-new-tokens", type=int, default=128, help="continuation length per prompt (default %(default)s)")
    t.add_argument("--prompt-chars", type=int, default=600, help="max corpus snippet per prompt (default %(default)s)")
    t.add_argument("--prompts-file", default=None,
                   help="JSONL of {\"text\": ...} user messages to continue instead of corpus snippets")
    t.add_argument("--gen-batch", type=int, default=16,
                   help="prompts generated at once (default %(default)s; raise it on a GPU)")
    t.set_defaults(func=cmd_draft_train)

    from attacks.cli import register as register_attack
    from benchmarks.cli import register as register_bench

    register_bench(sub)
    register_cloud(sub)
    register_attack(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    quiet_libraries()
    from attacks.errors import AttackError

    try:
        return int(args.func(args) or 0)
    except (SplitInferError, AttackError) as e:
        print(f"splitinfer: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("splitinfer: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
