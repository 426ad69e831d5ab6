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
from attacks.evaluate import prior_from_taps, score
from attacks.recipes.vocab_match import scoring_subset
from attacks.registry import get_attack_class, make_attack
from attacks.tapdata import Taps
from splitinfer.defenses import DefensePipeline
from splitinfer.defenses.lora_adv import check_fresh

__all__ = ["disclosed_attackers", "DISCLOSED", "FRESH_SEED"]

DISCLOSED = "white-box (learned), adaptive"
FRESH_SEED = 104_729  # added to the suite's seed: never the training adversary's (seed + 7919)


def disclosed_attackers(loaded, pipe: DefensePipeline, names: list[str], options: dict, victim_train: Taps,
                        test: Taps, rows: dict, seed: int, common: int | None) -> list[dict]:
    """Fresh learned attackers fitted on the fixed adapter's training-split states, scored on the victim's test
    states (and on the ``common`` prefix tokens every attacker of the cell is scored on)."""
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
        hp = {k: v for k, v in options.get(name, {}).items() if k != "scored_tokens"}
        atk = make_attack(name, model=loaded, seed=seed + FRESH_SEED, **hp)
        atk.fit(own)
        check_fresh(atk.module, Path(item.adapter))
        m = score(atk.invert(test, k=5), test, vocab_size=vocab, prior=prior)
        both = scoring_subset(test, rows, common, 0) if common else test
        on = m if not common else score(atk.invert(both, k=5), both, vocab_size=vocab, prior=prior)
        out.append({"attack": f"{name}+adapter-disclosed", "threat_model": DISCLOSED, "metrics": m,
                    "seconds": time.perf_counter() - t0, "test_tokens": test.n_tokens,
                    "common_top1": on["token_acc_top1"]})
    return out
