"""The ``feature-draft`` draft network: a recurrent MLP over the model's own final features, and its files.

The model's final normed state ``s_t`` (d,) (what the LM head sees at
position ``t``) predicts token ``t + 1``. The draft head maps the previous
feature and the embedding of the token at the next position to that
position's feature,

    s_j = s_{j-1} + W_o silu(W_i [rms(s_{j-1}) * g_s ; rms(E[x_j]) * g_e] + b_i) + b_o,

and reads it out with the model's own frozen LM head: ``logits_j =
lm_head(s_j)`` (tied to the input embedding ``E`` in SmolLM2). It is EAGLE
(Li et al. 2024, arXiv 2401.15077: autoregression at the feature level,
token embedding shifted by one, frozen LM head) with the transformer
decoder layer replaced by one MLP block (no attention over earlier draft
features: the context reaches it only through ``s_{j-1}``), so drafting needs
no KV cache at all; Hydra (Ankner et al. 2024, arXiv 2402.05109) is the
closest kin: sequentially dependent heads that see the previously guessed
token. Our deviations are listed in :mod:`.feature_draft`.

A head may carry a *vocabulary shortlist* (buffer ``vocab_shortlist``, (K,)
token ids): the drafter then reads out only those rows of the LM head, as
FR-Spec (Zhao et al. 2025, arXiv 2502.14856: frequency-ranked draft
vocabulary) and EAGLE-3's reduced draft vocabulary do. Drafting over a
K-token shortlist costs K/V of the full read-out, and a token outside it is
simply never drafted (the verifier still decides; exactness is untouched).

Files: ``DIR/feature_draft.safetensors`` (the weights, and the shortlist) and
``DIR/feature_draft.json`` (model sha256, dims, training sizes and held-out
agreement); never pickle. :func:`load_head` turns a file made for another
model, of the wrong shapes, or unreadable into a one-line
:class:`~splitinfer.errors.SplitInferError`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from splitinfer.atomic import check_made_for
from splitinfer.errors import SplitInferError

FORMAT = "splitinfer-feature-draft"
VERSION = 1
STEM = "feature_draft"


def rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Scale the last axis to unit root-mean-square (..., d) -> (..., d)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class FeatureHead(nn.Module):
    """One recurrent step (n, d) previous features x (n, d) token embeddings -> (n, d) next features."""

    def __init__(self, dim: int, hidden: int = 1024):
        super().__init__()
        if dim < 1 or hidden < 1:
            raise SplitInferError(f"feature head sizes must be >= 1, got dim={dim}, hidden={hidden}")
        self.dim, self.hidden = int(dim), int(hidden)
        self.gain_s = nn.Parameter(torch.ones(dim))  # g_s
        self.gain_e = nn.Parameter(torch.ones(dim))  # g_e
        self.w_in = nn.Linear(2 * dim, hidden)  # W_i, b_i
        self.w_out = nn.Linear(hidden, dim)  # W_o, b_o
        nn.init.zeros_(self.w_out.weight)  # start as "the next feature is the previous one"
        nn.init.zeros_(self.w_out.bias)
        self.register_buffer("vocab_shortlist", None)  # (K,) int64 token ids, or None for the whole vocabulary

    def forward(self, prev: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """prev (n, d) features s_{j-1}, emb (n, d) embeddings E[x_j] -> (n, d) features s_j."""
        z = torch.cat([rms(prev) * self.gain_s, rms(emb) * self.gain_e], dim=-1)  # (n, 2d)
        return prev + self.w_out(F.silu(self.w_in(z)))  # (n, d)


# ---------------------------------------------------------------------- files
def head_files(path: str | Path) -> tuple[Path, Path]:
    """(weights, config) paths for a directory, or for either file in it."""
    p = Path(path).expanduser()
    if p.suffix in (".json", ".safetensors"):
        p = p.parent
    return p / f"{STEM}.safetensors", p / f"{STEM}.json"


def _checked_shortlist(ids: torch.Tensor, vocab_size, where: Path) -> torch.Tensor:
    """A stored shortlist as (K,) int64, or a one-line error naming what is wrong with it."""
    if ids.dim() != 1 or ids.numel() == 0 or ids.dtype not in (torch.int32, torch.int64):
        raise SplitInferError(f"{where}: vocab_shortlist must be a non-empty 1-D integer tensor; retrain")
    ids = ids.long()
    if not isinstance(vocab_size, int) or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise SplitInferError(f"{where}: vocab_shortlist holds ids outside [0, {vocab_size}); retrain")
    if ids.unique().numel() != ids.numel():
        raise SplitInferError(f"{where}: vocab_shortlist repeats token ids; retrain")
    return ids


def weights_sha256(path: str | Path) -> str | None:
    """sha256 of a head's weights file (the run's record of which head it used); None when there is none."""
    import hashlib

    st = head_files(path)[0]
    return hashlib.sha256(st.read_bytes()).hexdigest() if st.is_file() else None


def default_dir(model_sha256: str) -> Path:
    """Where ``splitinfer draft-train`` writes by default: under the splitinfer cache, per model."""
    from splitinfer.models import cache_dir

    return cache_dir() / "feature_draft" / (model_sha256[:16] or "unknown")


RUN_KEYS = ("model_sha256", "vocab_size", "draft_vocab", "seed", "unroll", "steps", "batch", "lr", "reg_weight",
            "prompt_source", "corpora", "max_new_tokens")  # with hidden_size and mlp_hidden: what makes a run


def save_head(head: FeatureHead, out: str | Path, meta: dict, force: bool = False) -> Path:
    """Write the weights (safetensors) and ``meta`` + dims (JSON) into directory ``out``; returns the JSON path.

    Atomic, JSON last. A head of a different run (another model or training setting) in
    ``out`` is not overwritten unless ``force``.
    """
    from safetensors.torch import save_file

    from splitinfer.atomic import atomic_file, guard_overwrite, write_json

    st, js = head_files(out)
    run = {**{k: meta.get(k) for k in RUN_KEYS}, "hidden_size": head.dim, "mlp_hidden": head.hidden}
    guard_overwrite(js, run, "run", force, "a feature-draft head")
    info = {"format": FORMAT, "version": VERSION, **meta, "hidden_size": head.dim, "mlp_hidden": head.hidden,
            "run": run}
    js.unlink(missing_ok=True)  # until the new JSON lands, there is no head here
    with atomic_file(st) as tmp:
        save_file({k: (v.detach().float() if v.is_floating_point() else v.detach()).cpu().contiguous()
                   for k, v in head.state_dict().items()}, str(tmp))
    write_json(js, info, indent=1, sort_keys=True)
    return js


def load_head(path: str | Path, expect: dict | None = None) -> tuple[FeatureHead, dict]:
    """Read a head written by :func:`save_head`; ``expect`` entries (model_sha256, hidden_size...) must match."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    st, js = head_files(path)
    if not js.exists() or not st.exists():
        raise SplitInferError(f"no trained feature-draft head at {st.parent}: expected {js.name} and {st.name} "
                              "(train one with `splitinfer draft-train --model MODEL --out DIR`)")
    try:
        info = json.loads(js.read_text())
        dim, hidden = int(info["hidden_size"]), int(info["mlp_hidden"])
    except (ValueError, KeyError, TypeError) as e:
        raise SplitInferError(f"{js} is not a readable feature-draft config ({type(e).__name__}); retrain") from None
    check_made_for(info, js, FORMAT, VERSION, expect, "feature-draft head",
                   "train one for this model with `splitinfer draft-train`")
    try:
        tensors = load_file(str(st))
    except (SafetensorError, OSError, ValueError) as e:
        raise SplitInferError(f"{st} is not a readable safetensors file ({str(e).splitlines()[0][:80]}); "
                              "retrain with `splitinfer draft-train`") from None
    head = FeatureHead(dim, hidden)
    shortlist = tensors.pop("vocab_shortlist", None)
    want_shapes = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    got_shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    if got_shapes != want_shapes:
        raise SplitInferError(f"{st} holds tensors {sorted(got_shapes)} of the wrong names or shapes for a "
                              f"feature head of hidden size {dim} and MLP width {hidden}; retrain")
    head.load_state_dict(tensors)
    if shortlist is not None:
        head.vocab_shortlist = _checked_shortlist(shortlist, info.get("vocab_size"), st)
    return head.eval(), info
