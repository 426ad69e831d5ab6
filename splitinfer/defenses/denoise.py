"""``denoise``: a local denoiser that removes the head's noise from what the body returns (Split-and-Denoise).

Split-N-Denoise (Mai et al., "Split-and-Denoise: Protect large language model
inference with local differential privacy", arXiv 2310.09130, ICML 2024): the
user adds noise before the states leave, and a small model on the user's side,
trained on public text, maps the server's noisy output back towards the
undefended output, using what only the user knows: the noise it added. Here
the user knows the whole perturbation of each released row,
``delta = released - head state`` (clip and noise), and the body's output y at
the same rows; the denoiser returns

    y0 + s_y * MLP([y0 / s_y, delta / s_d]),   y0 = y - delta,

``y0`` removes the perturbation the residual stream carried straight through
the body (``mode=subtract`` stops there) and the MLP (one hidden layer, its
output layer zero at the start) is trained to predict the rest of the
undefended output, with the relative squared error per row as the loss, on
public text with the public weights and noise draws of sessions the
deployment never uses (:func:`train_denoiser`). The rows of the public
opening, released untouched at the start of a sequence, come back exact (no
earlier row was perturbed), so the denoiser leaves them as they are and never
trains on them (:func:`exact_rows`): a correction there moved the opening's
attention-sink state for every later position. Its weights and the scales
s_y, s_d live in a profile (:mod:`splitinfer.defenses.profiles`). The
denoiser runs only on the local side (between the reply and the tail), so it
changes nothing the cloud sees: recovery is that of the noise it is composed
with, and only utility moves.

Deviations from the paper: the denoiser is per token (SnD's is a small
transformer over the sequence, so it also sees the noise of earlier
positions that attention mixed in), it corrects the body's output states, not
the final embeddings, and it is trained for one noise spec and split.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from splitinfer.defenses.base import Defense, DefenseError, register_defense
from splitinfer.defenses.keyed import path_digests
from splitinfer.defenses.pipeline import DefensePipeline, exact_rows
from splitinfer.defenses.profiles import load_profile, save_profile
from splitinfer.defenses.rerun import boundary

__all__ = ["Denoise", "train_denoiser", "denoiser_pairs"]

log = logging.getLogger(__name__)
MODES = ("subtract", "learned")
TRAIN_SESSION0 = 1 << 22  # sessions whose draws the denoiser trains on (never a deployment's)


def _mlp(t: dict[str, torch.Tensor], y0: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """(N, d) correction in units of s_y from (N, d) y0 and delta."""
    z = torch.cat([y0 / t["s_y"], delta / t["s_d"]], -1)  # (N, 2d)
    return torch.nn.functional.gelu(z @ t["w1"].T + t["b1"]) @ t["w2"].T + t["b2"]


@register_defense("denoise")
@dataclass(frozen=True)
class Denoise(Defense):
    """Local denoiser of the body's reply (``mode``: subtract the perturbation, or also the learned MLP)."""

    mode: str = "learned"
    profile: str = ""

    kind = "wire"
    strength = ("mode",)
    shown = ("profile",)

    def validate(self) -> None:
        if self.mode not in MODES:
            raise DefenseError(f"denoise: mode={self.mode!r} is not one of {', '.join(MODES)}; e.g. denoise.mode=learned")

    def apply(self, x: torch.Tensor, positions: Sequence[int], session: int, direction: str,
              content: Sequence[int] | None = None) -> torch.Tensor:
        """Nothing on the wire: the denoiser runs on the reply (:meth:`denoise`)."""
        return x

    def denoise(self, back: torch.Tensor, delta: torch.Tensor, exact: int = 0) -> torch.Tensor:
        """(1, T, d) body output as received, (1, T, d) released - head states -> (1, T, d) denoised output;
        the first ``exact`` rows (:func:`exact_rows`) are returned as received."""
        y0 = back - delta
        if self.mode == "subtract":
            return y0
        t, _ = load_profile(self.profile, "denoise")  # on the CPU: moved beside the reply
        t = {k: v.to(back.device) for k, v in t.items()}
        if t["w2"].shape[0] != back.shape[-1]:
            raise DefenseError(f"denoise: profile {self.profile} was trained at width {t['w2'].shape[0]}, the "
                               f"states have {back.shape[-1]}; train it on this model")
        out = y0.clone()
        rest = y0[0, exact:]  # (T - exact, d)
        out[0, exact:] = rest + t["s_y"] * _mlp(t, rest, delta[0, exact:])
        return out


def denoiser_pairs(model: torch.nn.Module, depth: int, body_end: int, noise: DefensePipeline,
                   seqs: Sequence[Sequence[int]], session0: int = TRAIN_SESSION0,
                   public: Sequence[int] | None = None) -> dict[str, torch.Tensor]:
    """{y0, delta, clean}: (N, d) each, the body's output under ``noise`` minus the perturbation, the
    perturbation, and the undefended body output, over the positions of ``seqs`` the denoiser corrects
    (public weights). ``public``: per sequence, how many leading positions the runtime releases untouched (its
    public opening, ``splitinfer.tokens.public_prefix_length``; none if omitted): those rows come back exact,
    the denoiser leaves them alone (:func:`exact_rows`), and they are not in the pairs."""
    out: dict[str, list] = {"y0": [], "delta": [], "clean": []}
    device = next(model.parameters()).device
    with torch.no_grad():
        for i, seq in enumerate(tqdm(seqs, desc="denoiser pairs", unit="seq", leave=False)):
            ids = torch.tensor([list(seq)], device=device)
            _, clean = boundary(model, ids, reads=(body_end,))
            sent: list[torch.Tensor] = []

            def edit(h: torch.Tensor) -> torch.Tensor:  # (1, T, d)
                n = public[i] if public is not None else 0
                rel = noise.transform_up(h.float(), range(h.shape[1]), session0 + i, path_digests(0, seq),
                                         [k < n for k in range(h.shape[1])])
                sent.append(rel.float() - h.float())
                return rel.to(h.dtype)

            _, noisy = boundary(model, ids, {depth: edit}, reads=(body_end,))
            delta = sent[0][0]  # (T, d)
            skip = exact_rows(delta, 0)
            out["delta"].append(delta[skip:])
            out["y0"].append(noisy[body_end][0, skip:].float() - delta[skip:])
            out["clean"].append(clean[body_end][0, skip:].float())
    return {k: torch.cat(v) for k, v in out.items()}


def train_denoiser(pairs: dict[str, torch.Tensor], meta: dict, hidden: int = 256, epochs: int = 300,
                   lr: float = 3e-3, seed: int = 0) -> tuple[str, dict]:
    """Fit the MLP on :func:`denoiser_pairs`; store it as a profile. Returns (key, fit report)."""
    torch.manual_seed(seed)
    y0, delta, clean = pairs["y0"], pairs["delta"], pairs["clean"]  # (N, d) each
    n, d = y0.shape
    s_y = y0.pow(2).mean().sqrt().clamp_min(1e-6)
    s_d = delta.pow(2).mean().sqrt().clamp_min(1e-6)
    t = {"w1": torch.randn(hidden, 2 * d) / (2 * d) ** 0.5, "b1": torch.zeros(hidden),
         "w2": torch.zeros(d, hidden), "b2": torch.zeros(d)}
    t = {k: v.to(y0.device) for k, v in t.items()}  # drawn on the CPU (the same init), trained beside the pairs
    for v in t.values():
        v.requires_grad_(True)
    opt = torch.optim.Adam(list(t.values()), lr=lr)
    perm = torch.randperm(n)
    val, fit = perm[: max(1, n // 10)], perm[max(1, n // 10):]
    weight = 1.0 / clean.pow(2).sum(-1).clamp_min(1e-6)  # (N,) relative error per row

    def loss(rows: torch.Tensor) -> torch.Tensor:
        pred = y0[rows] + s_y * _mlp({**t, "s_y": s_y, "s_d": s_d}, y0[rows], delta[rows])
        return ((pred - clean[rows]).pow(2).sum(-1) * weight[rows]).mean()

    with torch.no_grad():
        before = after = float(loss(val))  # the zero output layer: y0 alone (mode=subtract)
    best = {k: v.detach().clone() for k, v in t.items()}
    for epoch in tqdm(range(epochs), desc="denoiser", unit="epoch", leave=False):
        opt.zero_grad()
        loss(fit).backward()
        opt.step()
        if epoch % 10 == 9:  # early stopping on the held-out rows: never worse than subtracting alone
            with torch.no_grad():
                now = float(loss(val))
            if now < after:
                after, best = now, {k: v.detach().clone() for k, v in t.items()}
    report = {"rows": n, "val_rel_err_subtract": before, "val_rel_err_learned": after}
    log.info("denoiser: validation relative error %.4f (subtract only) -> %.4f (learned)", before, after)
    tensors = best | {"s_y": s_y.reshape(1), "s_d": s_d.reshape(1)}
    return save_profile("denoise", tensors, {**meta, "hidden": hidden, "epochs": epochs, **report}), report
