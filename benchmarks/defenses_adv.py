"""``lora-adv`` in the defenses stage: fresh attackers trained on the fixed adapter's own states.

An adversarially trained adapter (:mod:`splitinfer.defenses.lora_adv`) is
only as good as the attacker it is scored against, and the adversary it was
trained with is the one attacker it is guaranteed to beat. After the adapter
is fixed, the stage therefore fits *fresh* learned attackers (new
initialisation, a seed the training adversary never used) on the fixed
adapter's own states of the training split: the adapter disclosed to the
attacker, the ``white-box (learned)`` setting of DESIGN.md section 4 (the
strongest case, stronger than ``paired``), and scores them on the victim's
test states, beside the stage's public-weights attackers (``shadow``). Each
fresh attacker is checked against the training adversary's recorded weights
(:func:`splitinfer.defenses.lora_adv.check_fresh`).
"""

from __future__ import annotations

import time
from pathlib import Path

from attacks.defended import attacker_view, defend_taps
from attacks.evaluate import prior_from_taps
from attacks.registry import get_attack_class, make_attack
from attacks.tapdata import Taps
from benchmarks.grid_cell import score_on_set
from splitinfer.defenses import DefensePipeline
from splitinfer.defenses.lora_adv import check_fresh

__all__ = ["disclosed_attackers", "DISCLOSED", "FRESH_SEED"]

DISCLOSED = "white-box (learned), adaptive"
FRESH_SEED = 104_729  # added to the suite's seed: never the training adversary's (seed + 7919)


def disclosed_attackers(loaded, pipe: DefensePipeline, names: list[str], options: dict, victim_train: Taps,
                        target: Taps, seed: int, run: str, preds: dict, n_boot: int = 1000) -> list[dict]:
    """Fresh learned attackers fitted on the fixed adapter's training-split states, scored on the cell's scored
    set (``target``, the victim's defended states, as every attacker of the cell); per-token predictions go to
    ``preds[f"{run}/{name}+adapter-disclosed"]``."""
    item = pipe.get("lora-adv")
    if item is None:
        return []
    own = defend_taps(victim_train, attacker_view(pipe))  # with a wire defense composed: the attacker's own draws
    vocab, prior = int(loaded.config.vocab_size), prior_from_taps(victim_train)
    out = []
    for name in names:
        if get_attack_class(name).scoring == "prefixes":  # matching attacks invert the public weights: not fresh-fit
            continue
        t0 = time.perf_counter()
        atk = make_attack(name, model=loaded, seed=seed + FRESH_SEED, **options.get(name, {}))
        atk.fit(own)
        check_fresh(atk.module, Path(item.adapter))
        label = f"{name}+adapter-disclosed"
        got, preds[f"{run}/{label}"] = score_on_set(atk.invert(target, k=5), target, vocab=vocab, prior=prior,
                                                    n_boot=n_boot, seed=seed, meta={"attack": label,
                                                                                    "defense": pipe.label})
        out.append({"attack": label, "threat_model": DISCLOSED, **got, "seconds": time.perf_counter() - t0})
    return out
