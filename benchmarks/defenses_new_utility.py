"""Utility alone of the issue-29 defenses on the default model, small enough for under about a CPU-minute.

Next-token agreement with the undefended model (:func:`benchmarks.stage_defenses.defended_utility`, teacher-forced
through the runtime) at head 2 / tail 2, on the first 64 tokens of 3 prose and 3 chat test documents; clips
calibrated on 8 + 8 training documents (96 tokens each), the Fisher on 4 of them (48 tokens). No attacker, no
interval: a quick check, not a defense table (``benchmarks.defenses_new_study`` is that).

    python -m benchmarks.defenses_new_utility
"""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.stage_defenses import defended_utility
from splitinfer.corpora import load_corpus
from splitinfer.defenses import DefensePipeline
from splitinfer.defenses.pclip import calibrate_clips, save_clips
from splitinfer.defenses.rerun import boundary
from splitinfer.defenses.shaped_noise import fisher_diag, fisher_scale
from splitinfer.models import load_model
from splitinfer.tokens import encode_texts


def _seqs(tok, split: str, n: int, length: int) -> list[list[int]]:
    out = []
    for corpus in ("prose", "chat"):
        texts = list(load_corpus(corpus, split, max_docs=n, tokenizer=tok)["text"])
        out += [e.ids[:length] for e in encode_texts(tok, texts) if len(e.ids) >= 16][:n]
    return out


def main() -> int:
    torch.set_num_threads(1)
    m = load_model("default")
    cal, held = _seqs(m.tokenizer, "train", 8, 96), _seqs(m.tokenizer, "test", 3, 64)
    with torch.no_grad():
        hs = [boundary(m.model, torch.tensor([s]), reads=(2,))[1][2][0] for s in cal]  # (T, d) each
    norms = torch.cat([h.norm(dim=-1) for h in hs]).numpy()
    pos = np.concatenate([np.arange(len(h)) for h in hs])
    med = float(np.median(norms[pos >= 1]))  # noise's default clip in the stage
    keys = {p: save_clips(calibrate_clips(norms, pos, None, p), p, {"study": "utility"}) for p in (50.0, 90.0, 99.0)}
    shape = fisher_scale(fisher_diag(m.model, 2, [s[:48] for s in cal[:4]]))
    skey = save_clips(calibrate_clips(norms, pos, None, 90.0), 90.0, {"study": "utility"}, {"scale": shape},
                      kind="shaped-noise")
    p90 = f"percentile=90.0,profile={keys[90.0]}"
    specs = [f"noise(sigma=0.0,clip={med:.2f})"] + [f"pclip(sigma=0.0,percentile={p},profile={k})"
                                                    for p, k in keys.items()] + [
        f"noise(sigma=0.02,clip={med:.2f})", f"pclip(sigma=0.02,{p90})", f"shaped-noise(sigma=0.02,percentile=90.0,"
        f"profile={skey})", f"pclip(sigma=0.02,{p90})+denoise(mode=subtract)", f"pclip(sigma=0.05,{p90})",
        f"pclip(sigma=0.05,{p90})+denoise(mode=subtract)"]
    print(f"| defense (head 2, tail 2) | next-token agreement | positions |\n|---|---|---|")
    for spec in specs:
        u = defended_utility(m, 2, 2, DefensePipeline.parse(spec), held)
        print(f"| `{spec}` | {100 * u['next_token_agreement']:.1f}% | {u['positions']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
