"""Calibrate the defenses that need public tensors before they run (``pclip``, ``shaped-noise``, ``denoise``).

A suite names ``pclip(sigma=0.05,percentile=90.0)`` without ``profile=``; the
defenses stage then fits the profile on the *training* split's public-model
states at that depth (the attackers' auxiliary text, never the scored test
documents, and the same for every attacker since the profile is public):

- ``pclip``: per-position clips, the percentile of the state norms at
  positions 0..3 and of positions >= 4, public positions left out
  (:func:`splitinfer.defenses.pclip.calibrate_clips`);
- ``shaped-noise``: the same clips and the inverse-Fisher noise shape from
  :data:`FISHER_SEQUENCES` training sequences
  (:func:`splitinfer.defenses.shaped_noise.fisher_diag`);
- ``denoise``: the local denoiser, trained on :data:`DENOISER_SEQUENCES`
  chat-form sequences of the corpora's training split (the form the runtime
  sends text in, and utility is measured on: the taps' plain-prose sequences
  left it costing agreement) under the spec's other (already calibrated)
  transforms with draws of sessions no test sequence uses
  (:func:`splitinfer.defenses.denoise.train_denoiser`).

Profiles go to the profile store (:mod:`splitinfer.defenses.profiles`); the
row's label carries their keys.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging

import numpy as np

from attacks.defended import public_mask
from attacks.tapdata import Taps
from benchmarks.defense_utility import iter_chat_form
from splitinfer.defenses import DefensePipeline
from splitinfer.defenses.denoise import denoiser_pairs, train_denoiser
from splitinfer.defenses.pclip import PositionClip, calibrate_clips, save_clips
from splitinfer.defenses.shaped_noise import ShapedNoise, fisher_diag, fisher_scale
from splitinfer.tokens import public_prefix_length

__all__ = ["calibrate", "denoiser_sequences", "FISHER_SEQUENCES", "DENOISER_SEQUENCES"]

log = logging.getLogger(__name__)
FISHER_SEQUENCES = 24
DENOISER_SEQUENCES = 48


def _sequences(train: Taps, n: int) -> list[list[int]]:
    return [train.token_ids[rows].tolist() for _, rows in list(train.sequences())[:n] if rows.stop - rows.start > 1]


def _clips(train: Taps, percentile: float):
    norms = np.linalg.norm(np.asarray(train.hidden, dtype=np.float32), axis=1)  # (N,)
    public = np.concatenate([public_mask(train, i, rows) for i, rows in train.sequences()])
    return calibrate_clips(norms, train.positions(), public, percentile)


def denoiser_sequences(loaded, corpora: list[str], max_length: int, seed: int) -> list[list[int]]:
    """The denoiser's :data:`DENOISER_SEQUENCES` chat-form training-split sequences of ``corpora``."""
    return list(itertools.islice(iter_chat_form(loaded, corpora, max_length, seed, "train"), DENOISER_SEQUENCES))


def calibrate(loaded, pipe: DefensePipeline, depth: int, tail: int, train: Taps, seed: int,
              corpora: list[str], max_length: int) -> DefensePipeline:
    """``pipe`` with a profile fitted for each calibrated defense that names none (others as they are);
    ``corpora`` / ``max_length``: the suite's, whose training split the denoiser learns on."""
    items = list(pipe.items)
    meta = {"model_sha256": loaded.sha256, "depth": depth, "train_tokens": int(train.n_tokens), "seed": seed}
    for i, d in enumerate(items):
        if isinstance(d, PositionClip) and not d.profile:
            clips = _clips(train, d.percentile)
            if isinstance(d, ShapedNoise):
                fisher = fisher_diag(loaded.model, depth, _sequences(train, FISHER_SEQUENCES), seed=seed)
                key = save_clips(clips, d.percentile, meta, {"scale": fisher_scale(fisher)}, kind=d.name)
            else:
                key = save_clips(clips, d.percentile, meta, kind=d.name)
            items[i] = dataclasses.replace(d, profile=key)
    for i, d in enumerate(items):
        if d.name == "denoise" and d.mode == "learned" and not d.profile:
            noise = DefensePipeline([x for x in items if x.kind == "wire" and x.name != "denoise"])
            body_end = int(loaded.model.config.num_hidden_layers) - tail
            seqs = denoiser_sequences(loaded, corpora, max_length, seed)
            pairs = denoiser_pairs(loaded.model, depth, body_end, noise, seqs,
                                   public=[public_prefix_length(loaded.tokenizer, s) for s in seqs])
            key, report = train_denoiser(pairs, {**meta, "noise": noise.label, "tail": tail}, seed=seed)
            log.info("denoise at head %d under %s: %s", depth, noise.label, report)
            items[i] = dataclasses.replace(d, profile=key)
    return DefensePipeline(items)
