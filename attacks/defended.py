"""Victims under a defense, for the attackers: defended taps and privately changed local layers.

:func:`defend_taps` turns clean teacher-forced taps into exactly what the cloud
receives under a wire defense (noise, quant), sequence by sequence, with the
same keyed draws the runtime uses (:meth:`DefensePipeline.simulate_up`; each
sequence is its own session). Learned attackers trained on these taps are the
adaptive learned attackers of DESIGN.md section 4: they know the mechanism and
its public parameters and make their own defended pairs, but never see the
victim's draws (the victim's seed differs from the attacker's, see
:func:`attacker_view`). :func:`victim_model` gives the model whose first
``depth`` layers carry the model defenses (lora-random): extract taps from it
for the victim; attackers keep the public model (that is the ``shadow``
setting).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

import numpy as np
import torch

from attacks.tapdata import Taps
from splitinfer.corpora import template_token_mask
from splitinfer.defenses import DefensePipeline
from splitinfer.defenses.lora_random import with_head_layers


def public_mask(taps: Taps, i: int, rows: slice) -> np.ndarray:
    """(T,) bool of sequence ``i``: the positions the cloud knows without user text (DESIGN.md section 5): tokens
    the tokenizer added (no character: offsets (0, 0)) and chat-template tokens; all False without offsets."""
    if taps.offsets is None:
        return np.zeros(rows.stop - rows.start, dtype=bool)
    off = np.asarray(taps.offsets[rows], dtype=np.int64)  # (T, 2)
    spans = taps.documents[int(taps.seq_doc[i])].get("template_spans") or []
    return template_token_mask(off, spans)  # template spans and zero-width (added) tokens


def wire_dtype_of(taps: Taps) -> torch.dtype:
    """The dtype the taps' states crossed the wire in: the model family's (bf16 for Gemma), else fp16."""
    return torch.bfloat16 if taps.meta.get("wire_dtype") == "bf16" else torch.float16


def defend_taps(taps: Taps, pipeline: DefensePipeline, session0: int = 0) -> Taps:
    """(N, d) states -> (N, d) float32 states as the cloud's body receives them under ``pipeline``'s wire part
    (each sequence's public mask passed to the defenses that release its leading run, the public opening,
    untouched, as the runtime does)."""
    if not pipeline.transforms and pipeline.codec is None:
        return taps
    out = np.empty(taps.hidden.shape, dtype=np.float32)
    wire = wire_dtype_of(taps)
    for i, rows in taps.sequences():
        h = torch.from_numpy(np.asarray(taps.hidden[rows], dtype=np.float32)).to(wire)  # (T, d) as on the wire
        out[rows] = pipeline.simulate_up(h, taps.token_ids[rows].tolist(), session0 + i,
                                         public_mask(taps, i, rows).tolist()).numpy()
    meta = {**taps.meta, "defense": pipeline.label}
    return Taps(out, taps.token_ids, taps.seq_lengths, taps.seq_doc, taps.documents, taps.offsets, meta)


def attacker_view(pipeline: DefensePipeline, seed_offset: int = 1_000_003) -> DefensePipeline:
    """The same defense with the attacker's own secret seeds: what an adaptive attacker can simulate."""
    items = [dataclasses.replace(d, seed=d.seed + seed_offset) if "seed" in d.secret else d for d in pipeline.items]
    return DefensePipeline(items)


def victim_model(loaded, pipeline: DefensePipeline, depth: int):
    """A LoadedModel whose first ``depth`` layers carry the model defenses (private copies); ``loaded`` if none.

    Its ``sha256`` is tagged with the defense label, so tap caches never mix victims.
    """
    items = [d for d in pipeline.model_items if hasattr(d, "apply_head")]
    if not items:
        return loaded
    holder = torch.nn.Module()
    holder.layers = torch.nn.ModuleList(list(loaded.model.model.layers[:depth]))
    DefensePipeline(items).apply_head(holder)
    model = with_head_layers(loaded.model, list(holder.layers))  # shallow: the other layers are shared
    tag = hashlib.sha256(f"{loaded.sha256}/{pipeline.label}/{depth}".encode()).hexdigest()
    return dataclasses.replace(loaded, model=model, sha256=tag)


def knowledge_label(recipe_label: str, private_local_layers: bool) -> str:
    """DESIGN.md section 4: ``shadow`` for a public-weights (``white-box``) attacker when the victim's local layers
    were changed privately, else the recipe's own label. The one place this rule is written."""
    return "shadow" if private_local_layers and recipe_label.startswith("white-box") else recipe_label


def threat_label(recipe_label: str, pipeline: DefensePipeline, adaptive: bool) -> str:
    """The result's attacker knowledge (DESIGN.md section 4) against a victim under ``pipeline``.

    :func:`knowledge_label` with the victim's private local layers (lora-random, lora-private); ``, adaptive``
    when the victim is defended and the attacker knew the mechanism (trained on its own defended pairs, or an
    adaptive recipe).
    """
    base = knowledge_label(recipe_label, any(hasattr(d, "apply_head") for d in pipeline.model_items))
    return f"{base}, adaptive" if adaptive and not pipeline.is_none else base


def as_public(taps: Taps, public) -> Taps:
    """Victim taps presented to attackers holding the public model: they carry its sha256 (and the victim's apart).

    Attack checks compare the taps' model with the attacker's; a privately changed victim differs by design
    (the ``shadow`` setting), so the victim's own hash is kept as ``victim_sha256``.
    """
    if taps.meta.get("model_sha256") == public.sha256:
        return taps
    meta = {**taps.meta, "victim_sha256": taps.meta.get("model_sha256"), "model_sha256": public.sha256}
    return Taps(taps.hidden, taps.token_ids, taps.seq_lengths, taps.seq_doc, taps.documents, taps.offsets, meta)


def cloud_body_layer(loaded, pipeline: DefensePipeline, depth: int) -> torch.nn.Module:
    """The first body layer (index ``depth``) as the cloud holds it under ``pipeline`` (permute: transformed).

    What an attacker who *is* the cloud has besides the public weights; the harness hands it to attacks that
    :meth:`observe_cloud` (``vocab-match-adaptive`` under ``permute``).
    """
    holder = torch.nn.Module()
    holder.layers = torch.nn.ModuleList([loaded.model.model.layers[depth]])
    pipeline.apply_body(holder, loaded.hidden_size)
    return holder.layers[0]


def show_cloud(attack, loaded, pipeline: DefensePipeline, depth: int) -> None:
    """Give ``attack`` the cloud's own body weights when the defense changed them and it can use them."""
    if pipeline.needs_cloud_weights and hasattr(attack, "observe_cloud"):
        attack.observe_cloud(cloud_body_layer(loaded, pipeline, depth), depth)


def show_traffic(attack, released: Callable[[], Taps]) -> None:
    """Give ``attack`` the victim's released states of every session it served (``released()``: made only when
    the attack can use them, ``observe_traffic``): the cloud sees all of a deployment's traffic, not just the
    sequences it is scored on, and never their tokens (an attack must not read ``token_ids`` beyond public
    positions)."""
    if hasattr(attack, "observe_traffic"):
        attack.observe_traffic(released())


def resent_taps(taps: Taps, pipeline: DefensePipeline, repeats: int, session0: int = 0) -> list[Taps]:
    """The same sequences released ``repeats`` times under ``pipeline``, each time in fresh sessions (new draws)."""
    stride = max(1, len(taps))
    return [defend_taps(taps, pipeline, session0 + i * stride) for i in range(repeats)]


def applies(attack_cls, pipeline: DefensePipeline) -> bool:
    """Whether an attack recipe is run against ``pipeline``: its ``applies_to`` (defense names it is designed to
    break; ``none`` for the undefended victim) meets the pipeline's, and none of its ``refuses`` is there.
    Recipes without ``applies_to`` run against every defense."""
    names = {d.name for d in pipeline.items} or {"none"}
    wanted = getattr(attack_cls, "applies_to", None)
    return (wanted is None or bool(names & set(wanted))) and not names & set(getattr(attack_cls, "refuses", ()))
