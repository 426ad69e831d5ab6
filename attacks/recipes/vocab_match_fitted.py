"""Vocabulary matching with a self-fitted adapter (``vocab-match-fitted``): against privately changed local
layers the attacker fits its own LoRA to the very states it inverts, with its own recovered tokens as labels.

Against a victim whose local layers carry a private LoRA (``lora-private``,
``lora-random``) the public head no longer reproduces the observed states, and
:class:`~attacks.recipes.vocab_match_adaptive.AdaptiveVocabMatch` takes the
nearest candidate rather than an exact match. This recipe, at each
:meth:`invert` call:

1. runs that search with the public head on the observed states;
2. takes its own recovered tokens as pseudo-labels, keeps the confident
   positions (below), and fits a LoRA of rank ``fit_rank`` (``peft``, through
   :func:`splitinfer.defenses.lora_private.trainable_lora`, on copies of the
   public head layers) so that the adapted head maps the recovered token
   sequences, teacher-forced, to the observed states: ``fit_steps`` full-batch
   Adam steps on the mean squared :func:`match_distance` (the elementwise
   relative error the search ranks by) over the kept positions;
3. merges the adapter (:func:`splitinfer.defenses.lora_random.merge_lora`) and
   runs the search again with the adapted head; ``rounds`` times, continuing
   the same adapter on each round's new pseudo-labels, stopping early when a
   round recovers the same tokens as the one before.

Every ``CHECK_EVERY``-th position of each sequence is held out of every fit;
the round returned (the public search included) is the one whose first
guesses lie nearest the observed states there (mean :func:`match_distance`):
a check that the adapter generalises beyond the positions it was fitted on,
without plaintext. (Compared on all positions instead, the fitted positions
favour the adapted head whatever it does elsewhere; on the tiny model that
returned rounds that recovered less than the public search.)

Confident positions: the share ``keep`` of positions with the smallest margin
ratio d1 / d2 (nearest candidate's distance over the second nearest's). The
ratio is scale-free (absolute distances grow with depth, and along a sequence
behind a wrong token), and a ratio near 1 marks a position where the public
head cannot tell two tokens apart, where the pseudo-label is most likely
wrong. A share rather than a threshold, so one default serves every depth and
strength. On the tiny model (lora-random, rank 4, scale 0.1, head 2) ranking
by d1 alone kept labels as clean (98% right at keep=0.5, 70% at 0.75).

Threat model: it uses only the public weights, the defense's public label
(``defense=``, as vocab-match-adaptive) and the states it inverts: no
plaintext from the deployment (k = 0, not ``paired``). Against private local
layers it is ``shadow, adaptive`` (:func:`attacks.defended.knowledge_label`).
It is *transductive*: the adapter is fitted on the very states it is asked to
invert (without their plaintext), anew at each :meth:`invert` call, and is
not part of the checkpoint (:attr:`adapted` holds the last one). With no
private local layers in ``defense`` it runs exactly vocab-match-adaptive's
search and ``info['adapter_fitted']`` is False.

Related work and deviations: self-training with pseudo-labels (Yarowsky, ACL
1995; Lee, "Pseudo-Label", ICML 2013 workshop), here adapting the forward
model that the search inverts, not a classifier; BiSR (Chen et al.,
"Unveiling the Vulnerability of Private Fine-Tuning in Split-Based Frameworks
for Large Language Models: A Bidirectionally Enhanced Attack", CCS 2024),
which fits its attack models to the victim's observed activations. Unlike
BiSR it fits an adapter on the public forward head, not a learned inverse
model; its labels are the vocabulary search's own output; and it has no
moment-matching term on auxiliary text (the regression on confident
positions is the only loss). Kept positions behind a wrong token are
regressed with that wrong prefix. The loss ignores wire defenses composed
with the private layers (noise, quant): the observed states are regressed as
they arrive.

Cost (not measured on the default model): each round is one more full search,
and the fit is ``fit_steps`` forward-backward passes of the scored sequences
through the head (8 sequences x 16 tokens for a cell of the full suite: 64
scored tokens per corpus, 2 corpora), against the search's ~100 single-token
gradient steps plus a few hundred candidates at each of those 128 positions.
So the defaults (``rounds=1``, ``fit_steps=100``) should cost about 2.1x
vocab-match-adaptive (two searches and a fit of a few percent of one);
``rounds=2`` about 3.2x. The harness fits anew at each ``invert`` call: scored
on two prefix sizes it pays twice.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any

import numpy as np
import torch

from attacks.base import Inversion
from attacks.errors import AttackError
from attacks.recipes.vocab_match import VocabMatch, match_distance
from attacks.recipes.vocab_match_adaptive import AdaptiveVocabMatch
from attacks.registry import register_attack
from attacks.tapdata import Taps
from splitinfer.defenses.lora_private import trainable_lora
from splitinfer.defenses.lora_random import copy_lora, merge_lora, with_head_layers
from splitinfer.kv_cache import PartKVCache

log = logging.getLogger(__name__)

CHECK_EVERY = 5  # every 5th position of a sequence is held out of every fit: the rounds are compared there
# rounds 1, fit_steps 100 at lr 2e-3: about 2.1x vocab-match-adaptive on a full-suite cell (module docstring);
# fit_rank None: the defense's public rank (lora-private(rank=8,...)), 8 when its label names none
FIT_DEFAULTS = {"rounds": 1, "fit_rank": None, "fit_steps": 100, "fit_lr": 2e-3, "keep": 0.5}


def confident(d1: np.ndarray, d2: np.ndarray, keep: float) -> np.ndarray:
    """(N,) nearest and (N,) second-nearest distances -> (N,) bool: the ``keep`` share with the smallest d1/d2."""
    ratio = np.where(np.isfinite(d2) & (d2 > 0), d1 / np.where(d2 > 0, d2, 1.0), 1.0)  # (N,)
    out = np.zeros(len(ratio), dtype=bool)
    out[np.argsort(ratio, kind="stable")[: max(1, int(math.ceil(keep * len(ratio))))]] = True
    return out


def held_out(taps: Taps) -> np.ndarray:
    """(N,) bool: every ``CHECK_EVERY``-th position of each sequence (every ``CHECK_EVERY``-th row if no sequence
    is that long; none below ``CHECK_EVERY`` rows: then the rounds are compared on every row)."""
    out = taps.positions() % CHECK_EVERY == CHECK_EVERY - 1
    return out if out.any() else np.arange(taps.n_tokens) % CHECK_EVERY == CHECK_EVERY - 1


def padded(taps: Taps, values: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, ...) per-token values -> (S, T, ...) right-padded per sequence, and the (S, T) bool mask of real rows."""
    lengths = taps.seq_lengths
    out = torch.zeros((len(lengths), int(lengths.max()), *values.shape[1:]), dtype=torch.from_numpy(values).dtype)
    mask = torch.zeros((len(lengths), int(lengths.max())), dtype=torch.bool)
    for s, rows in taps.sequences():
        out[s, : rows.stop - rows.start] = torch.from_numpy(values[rows])
        mask[s, : rows.stop - rows.start] = True
    return out, mask


def _number(hp: dict[str, Any], key: str, ok, need: str, example: Any = None) -> None:
    x = hp[key]
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not ok(x):
        raise AttackError(f"vocab-match-fitted {key}={x!r} must be {need}; e.g. {key}="
                          f"{FIT_DEFAULTS[key] if example is None else example}")


@register_attack("vocab-match-fitted")
class FittedVocabMatch(AdaptiveVocabMatch):
    """White-box (exact) on public weights, adaptive, transductive: refits its head to the states it inverts."""

    defaults = {**AdaptiveVocabMatch.defaults, **FIT_DEFAULTS}

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        hp = self.hparams
        _number(hp, "rounds", lambda x: isinstance(x, int) and x >= 1, "an integer >= 1 (vocab-match-adaptive is "
                                                                       "the search without a fit)")
        _number(hp, "fit_steps", lambda x: isinstance(x, int) and x >= 1, "an integer >= 1")
        _number(hp, "fit_lr", lambda x: 0 < x < math.inf, "a finite number > 0")
        _number(hp, "keep", lambda x: 0 < x <= 1, "the share of positions fitted on, in (0, 1]")
        if hp["fit_rank"] is not None:
            _number(hp, "fit_rank", lambda x: isinstance(x, int) and x >= 1, "an integer >= 1, or None (the "
                                                                             "defense's own rank)", 8)
        self.private = [d for d in self.defense.model_items if hasattr(d, "apply_head")]
        self.adapted = None  # the LoadedModel with the last invert's chosen adapter merged (None: public head)

    def _rank(self) -> int:
        if self.hparams["fit_rank"] is not None:
            return int(self.hparams["fit_rank"])
        return int(next((d.rank for d in self.private if hasattr(d, "rank")), 8))

    # ------------------------------------------------------------ the adapter
    def _fit_adapter(self, holder: torch.nn.Module | None, taps: Taps, tokens: np.ndarray, keep: np.ndarray,
                     depth: int) -> tuple[torch.nn.Module, dict[str, float]]:
        """Fit (or continue) the LoRA so that the adapted head maps ``tokens`` to the observed states at ``keep``."""
        from attacks.taps import TruncatedForward

        model = self._need_model()
        if holder is None:
            with torch.random.fork_rng(devices=[]):  # its seeded init leaves the caller's generator as it was
                holder = trainable_lora(model.model.model.layers[:depth], self._rank(), self.seed)
        device = next(model.model.parameters()).device
        stack = TruncatedForward(with_head_layers(model.model, list(holder.layers)), depth)
        ids, real = padded(taps, tokens.astype(np.int64))  # (S, T), (S, T)
        obs, _ = padded(taps, np.asarray(taps.hidden, dtype=np.float32))  # (S, T, d)
        use = (padded(taps, keep)[0] & real).to(device)  # (S, T)
        ids, obs = ids.to(device), obs.to(device)[use]  # (S, T), (M, d): the kept positions' observed states
        opt = torch.optim.Adam([p for p in holder.parameters() if p.requires_grad], lr=float(self.hparams["fit_lr"]))
        positions = torch.arange(ids.shape[1])  # (T,)
        losses = []
        with torch.enable_grad():
            for _ in range(int(self.hparams["fit_steps"])):
                h = stack.run_layers(stack.embed_tokens(ids), positions, PartKVCache(), None)  # (S, T, d)
                loss = match_distance(h[use].float(), obs).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
        return holder, {"loss_initial": losses[0], "loss": losses[-1], "positions": int(use.sum())}

    def _merged(self, holder: torch.nn.Module, depth: int):
        """The public LoadedModel with the fitted adapter merged into copies of its head layers."""
        model = self._need_model()
        weights = {n: p.detach() for n, p in holder.named_parameters() if "lora_" in n}
        with torch.random.fork_rng(devices=[]):  # the wrappers' default init draws from it before copy_lora overwrites
            layers = merge_lora(model.model.model.layers[:depth], self._rank(), copy_lora(weights))
        return dataclasses.replace(model, model=with_head_layers(model.model, list(layers)))

    def scan_cap(self, vocab: int) -> int | None:
        """Under private layers the search is vocab-match's own (:meth:`_search`), so is its scan."""
        return VocabMatch.scan_cap(self, vocab) if self.private else super().scan_cap(vocab)

    def _search(self, taps: Taps, k: int, model) -> Inversion:
        """vocab-match's search on states already in the public basis, with ``model``'s head."""
        public, self.model = self.model, model
        try:
            return VocabMatch._invert(self, taps, k)  # not the adaptive override: the taps are turned back already
        finally:
            self.model = public

    # ------------------------------------------------------------ inversion
    def _invert(self, taps: Taps, k: int) -> Inversion:
        self.adapted = None
        if not self.private:
            inv = super()._invert(taps, k)
            inv.info.update(adapter_fitted=False, adapter_note="no private local layers in the defense: "
                                                               "vocab-match-adaptive's search, no adapter fitted")
            return inv
        t0 = time.perf_counter()
        taps = self._observed(taps)  # (N, d) in the public basis (permute)
        depth = int(self.meta.get("depth") or taps.meta.get("depth"))
        kk = max(k, 2)  # the second-nearest distance gives the margin
        inv = self._search(taps, kk, self.model)
        check = held_out(taps)  # (N,)
        compare = check if check.any() else np.ones(taps.n_tokens, dtype=bool)
        mean = [float(-inv.scores[compare, 0].mean())]  # mean nearest distance there per round, the public one first
        best, chosen, holder, fits, fit_s = inv, 0, None, [], 0.0
        for r in range(int(self.hparams["rounds"])):
            keep = confident(-inv.scores[:, 0], -inv.scores[:, 1], float(self.hparams["keep"]))  # (N,)
            keep = keep & ~check if (keep & ~check).any() else keep  # a handful of rows: fit on what there is
            t1 = time.perf_counter()
            holder, fit = self._fit_adapter(holder, taps, inv.tokens, keep, depth)
            fit_s += time.perf_counter() - t1
            model = self._merged(holder, depth)
            new = self._search(taps, kk, model)
            mean.append(float(-new.scores[compare, 0].mean()))
            fits.append({**fit, "changed": int((new.tokens != inv.tokens).sum()), "mean_distance": mean[-1]})
            log.info("vocab-match-fitted round %d: fitted on %d positions, loss %.4g -> %.4g; held-out mean distance "
                     "%.4g -> %.4g; %d tokens changed", r + 1, fit["positions"], fit["loss_initial"], fit["loss"],
                     mean[0], mean[-1], fits[-1]["changed"])
            if mean[-1] < mean[chosen]:
                best, chosen, self.adapted = new, r + 1, model
            unchanged, inv = bool(np.array_equal(new.tokens, inv.tokens)), new
            if unchanged:
                break
        seconds = time.perf_counter() - t0
        info = {**best.info, "seconds": round(seconds, 3), "seconds_per_token": seconds / max(taps.n_tokens, 1),
                "adapter_fitted": True, "adapter_rank": self._rank(), "adapter_steps": int(self.hparams["fit_steps"]),
                "adapter_rounds": len(fits), "adapter_chosen_round": chosen,
                "adapter_positions_used": fits[-1]["positions"], "adapter_positions_held_out": int(check.sum()),
                "adapter_positions": taps.n_tokens, "adapter_fit_loss_initial": fits[0]["loss_initial"],
                "adapter_fit_loss": fits[-1]["loss"], "adapter_mean_distance_public": mean[0],
                "adapter_mean_distance": mean[chosen], "adapter_seconds": round(fit_s, 3), "adapter_per_round": fits}
        return Inversion(best.tokens, best.topk[:, :k], best.scores[:, :k], info)
