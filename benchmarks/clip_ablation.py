"""Where the ``noise`` defense's utility cost comes from: the clip, the noise, and position 0.

``noise`` (:mod:`splitinfer.defenses.noise`) clips every state the head sends to L2 norm C and adds
N(0, (sigma C)^2) per coordinate. The `full` grid and the quick report found that the clip alone (sigma = 0)
already costs much of the agreement, and that at head depth 8 adding a little noise after the clip scores
*better* than the clip alone. This ablation separates the parts on the defenses stage's own utility measure
(:func:`benchmarks.stage_defenses.defended_utility`: next-token agreement and perplexity against the undefended
model, teacher-forced through the real runtime, on the same held-out sequences as the stage) with one variant of
the defense per row:

- ``defense``: the defense as built (every state clipped and noised);
- ``noise-pos0``: every state clipped, noise on position 0 only;
- ``noise-rest``: every state clipped, noise on every position but 0;
- ``keep-pos0``: the defense as built, but position 0 released untouched (neither clipped nor noised).

Position 0 is singled out because its state carries the model's attention sink and has a norm several times
the others' (Xiao et al., "Efficient Streaming Language Models with Attention Sinks", ICLR 2024; Sun et al.,
"Massive Activations in Large Language Models", COLM 2024); the report prints its norm beside C. The variants
are diagnostics, not defenses: they are not registered and no attacker is scored on them.

    python -m benchmarks.clip_ablation --depths 2,8 --sigmas 0,0.005,0.01,0.02 --out reports/clip_ablation
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence

import numpy as np
import torch
from tqdm import tqdm

from benchmarks.bench_output import document, write_dir
from benchmarks.schema import add_metric, metric
from benchmarks.stage_defenses import defended_utility, median_clip, split_taps, utility_sequences
from splitinfer.cli_flags import finite_float
from splitinfer.defenses import DefensePipeline
from splitinfer.defenses.base import DefenseError
from splitinfer.defenses.noise import Noise, clip_rows

VARIANTS = ("defense", "noise-pos0", "noise-rest", "keep-pos0")


@dataclasses.dataclass(frozen=True)
class AblatedNoise(Noise):
    """``noise`` with its clip and its noise applied by position (``variant``, one of :data:`VARIANTS`)."""

    variant: str = "defense"
    uses_public = False  # the ablation's variants choose their untouched rows themselves

    def validate(self) -> None:
        super().validate()
        if self.variant not in VARIANTS:
            raise DefenseError(f"unknown variant {self.variant!r}; choose from {', '.join(VARIANTS)}")

    def apply(self, x: torch.Tensor, positions: Sequence[int], session: int, direction: str,
              content: Sequence[int] | None = None) -> torch.Tensor:
        """(T, d) -> (T, d): the defense's release, then the variant's rows put back (clipped only, or untouched)."""
        y = super().apply(x, positions, session, direction, content)
        if direction == "down" or self.variant == "defense":
            return y
        pos0 = torch.tensor([p == 0 for p in positions])  # (T,)
        if self.variant == "keep-pos0":
            y[pos0] = x[pos0]
            return y
        clipped = clip_rows(x.float(), self.clip).to(x.dtype)  # (T, d)
        rows = ~pos0 if self.variant == "noise-pos0" else pos0  # the rows released clipped, without noise
        y[rows] = clipped[rows]
        return y


def norms_at(held) -> dict:
    """Mean L2 norm of the position-0 states and the median of the others, in the held-out taps."""
    pos = held.positions()
    norms = np.linalg.norm(np.asarray(held.hidden, dtype=np.float32), axis=1)  # (N,)
    return {"pos0_norm_mean": float(norms[pos == 0].mean()), "rest_norm_median": float(np.median(norms[pos >= 1]))}


def run(loaded, depths: list[int], sigmas: list[float], variants: list[str], *, clip: float | None = None,
        train_tokens: int = 40000, test_tokens: int = 4000, sequences: int = 8, corpora=("prose", "chat"),
        max_length: int = 128, tail: int = 2, progress: bool = True) -> list[dict]:
    """One row per (depth, variant, sigma); C is ``clip`` or the defenses stage's default (median_clip)."""
    cfg = {"corpora": list(corpora), "max_length": max_length}
    held, _ = split_taps(loaded, cfg, depths, "test", test_tokens // len(corpora))
    train = split_taps(loaded, cfg, depths, "train", train_tokens // len(corpora))[0] if clip is None else None
    seqs = utility_sequences(held[depths[0]], sequences)
    jobs = [(d, v, s) for d in depths for v in variants for s in sigmas]
    rows = []
    for d, v, s in tqdm(jobs, desc="clip ablation", unit="row", disable=not progress):
        c = clip if clip is not None else median_clip(train[d])
        pipe = DefensePipeline([AblatedNoise(sigma=s, clip=c, variant=v)])
        rows.append({"depth": d, "variant": v, "sigma": s, "clip": c, **norms_at(held[d]),
                     **defended_utility(loaded, d, tail, pipe, seqs)})
    return rows


def report(data: dict) -> str:
    lines = ["# Where noise's utility cost comes from: the clip, the noise, position 0", "",
             f"Model `{data['model']}`, {data['sequences']} held-out sequences ({data['positions']} positions) of "
             f"{', '.join(data['corpora'])}, tail {data['tail']} layers; commit {data['git']}. Agreement = "
             "next-token argmax agreement with the undefended model (teacher-forced, the defenses stage's measure).",
             "", "| head depth | C | position-0 norm (mean) | others' norm (median) | variant | sigma (x C) | "
             "next-token agreement | perplexity |", "|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        lines.append(f"| {r['depth']} | {r['clip']:g} | {r['pos0_norm_mean']:.1f} | {r['rest_norm_median']:.1f} | "
                     f"{r['variant']} | {r['sigma']:g} | {100 * r['next_token_agreement']:.1f}% | "
                     f"{r['perplexity']:.2f} |")
    lines += ["", "Variants: " + "; ".join(f"`{v}`: {VARIANT_TEXT[v]}" for v in VARIANTS) + ".", "",
              f"Wall time {data['wall_s']:.0f} s.", ""]
    return "\n".join(lines)


VARIANT_TEXT = {"defense": "the defense as built", "noise-pos0": "every state clipped, noise on position 0 only",
                "noise-rest": "every state clipped, noise everywhere but position 0",
                "keep-pos0": "the defense, position 0 released untouched"}


def to_document(data: dict) -> dict:
    config = {k: v for k, v in data.items() if isinstance(v, (str, int, float, bool)) or v is None}
    doc = document("clip-ablation", config, data)
    for r in data["rows"]:
        add_metric(doc, f"clip_ablation/head={r['depth']}/{r['variant']}/sigma={r['sigma']:g}", "next_token_agreement",
                   metric(r["next_token_agreement"], n=r["positions"], kind="info"))
    return doc


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    from benchmarks.checkout import git_state
    from splitinfer.models import load_model

    p = argparse.ArgumentParser(prog="python -m benchmarks.clip_ablation", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--depths", default="2,8", help="head depths (default 2,8)")
    p.add_argument("--sigmas", default="0,0.005,0.01,0.02", help="noise sigmas, in units of C (default 0,0.005,0.01,0.02)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    p.add_argument("--clip", type=finite_float, default=None,
                   help="C (default: the defenses stage's, the median state norm of --train-tokens training tokens)")
    p.add_argument("--train-tokens", type=int, default=40000, help="for the default C (default 40000, the full suite's)")
    p.add_argument("--test-tokens", type=int, default=4000, help="held-out taps (default 4000, the full suite's)")
    p.add_argument("--sequences", type=int, default=8, help="utility sequences (default 8, the full suite's)")
    p.add_argument("--out", required=True, help="directory for results.json and report.md")
    args = p.parse_args(argv)
    try:
        depths = [int(x) for x in args.depths.split(",") if x.strip()]
        sigmas = _floats(args.sigmas)
    except ValueError:
        p.error("--depths takes integers and --sigmas numbers, comma-separated, e.g. --depths 2,8 --sigmas 0,0.01")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        p.error(f"unknown variant {bad[0]!r}; choose from {', '.join(VARIANTS)}" if bad else "--variants is empty")
    if not depths or not sigmas or min(sigmas) < 0 or (args.clip is not None and args.clip <= 0):
        p.error("give at least one depth and one sigma >= 0, and a --clip > 0 if any")
    loaded = load_model(args.model)
    if max(depths) + 2 > loaded.num_layers or min(depths) < 1:
        p.error(f"head depths must lie in 1..{loaded.num_layers - 2} for this {loaded.num_layers}-layer model")
    git, dirty = git_state()
    t0 = time.perf_counter()
    rows = run(loaded, depths, sigmas, variants, clip=args.clip, train_tokens=args.train_tokens,
               test_tokens=args.test_tokens, sequences=args.sequences)
    data = {"model": loaded.spec, "model_sha256": loaded.sha256, "corpora": ["prose", "chat"], "tail": 2,
            "sequences": args.sequences, "positions": rows[0]["positions"], "train_tokens": args.train_tokens,
            "test_tokens": args.test_tokens, "git": f"{git}{' (dirty)' if dirty else ''}",
            "wall_s": time.perf_counter() - t0, "rows": rows}
    return write_dir(args.out, report(data), to_document(data))


if __name__ == "__main__":
    raise SystemExit(main())
