"""``lora-private`` in the defenses stage: the victim's adapter trained for the run, and the row's public label.

A suite names ``lora-private(rank=R,steps=S)`` without ``adapter=``: the stage
then trains the victim's adapter itself (:func:`splitinfer.defenses.lora_private.train_adapter`:
distillation to the public model plus the user's language-modelling loss) on
the *validation* split of the stage's corpora, i.e. on text that is neither
the attackers' auxiliary (training) corpus nor the scored test documents,
seeded by the suite's seed, into a temporary directory that the stage removes
when it ends (adapters are secrets: never written under ``reports/``). The
attackers keep the public weights: ``shadow`` (DESIGN.md section 4), and
``paired`` when they also hold k (state, token) pairs of the deployment.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from splitinfer.corpora import load_corpus
from splitinfer.defenses import DefensePipeline
from splitinfer.defenses.base import format_items
from splitinfer.defenses.lora_private import LoraPrivate, train_adapter

log = logging.getLogger(__name__)

MAX_DOCS = 256  # validation documents per corpus the victim's adapter is trained on


def paired_label(base: str, k: int) -> str:
    """DESIGN.md 4: a paired attacker *also* holds k deployment pairs: ``shadow, adaptive`` -> ``shadow, paired
    (k=100), adaptive``."""
    parts = base.split(", ")
    at = parts.index("adaptive") if "adaptive" in parts else len(parts)
    return ", ".join(parts[:at] + [f"paired (k={k})"] + parts[at:])


def _adapter_item(pipe: DefensePipeline) -> LoraPrivate | None:
    """The pipeline's trained-adapter defense (``lora-private``, ``lora-adv``), if any."""
    return next((d for d in pipe.items if isinstance(d, LoraPrivate)), None)


def public_label(pipe: DefensePipeline) -> str:
    """The row's label: the canonical one, without the adapter's path when a private adapter is part of it."""
    return format_items(pipe.items, public=True) if _adapter_item(pipe) is not None else pipe.label


def with_trained_adapter(loaded, pipe: DefensePipeline, depth: int, corpora: list[str], seed: int,
                         workdir: str) -> DefensePipeline:
    """``pipe`` with its ``lora-private`` / ``lora-adv`` item's adapter trained now when the spec names none (else
    as is)."""
    item = _adapter_item(pipe)
    if item is None or item.adapter:
        return pipe
    texts = [t for c in corpora
             for t in load_corpus(c, "val", seed=seed, max_docs=MAX_DOCS, tokenizer=loaded.tokenizer)["text"]]
    out = Path(workdir) / f"{item.name}-head{depth}-r{item.rank}-s{item.steps}"
    log.info("%s: training the victim's adapter at head %d (rank %d, %d steps)", item.name, depth, item.rank,
             item.steps)
    if hasattr(item, "train"):
        item.train(loaded, depth, texts, out, seed=seed)
    else:
        train_adapter(loaded, depth, texts, out, rank=item.rank, steps=item.steps, seed=seed)
    return DefensePipeline([dataclasses.replace(d, adapter=str(out)) if d is item else d for d in pipe.items])
