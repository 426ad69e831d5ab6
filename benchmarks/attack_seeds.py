"""Attacker training variance: a figure's spread across the seeds an attacker was trained with (issue 14 item 6).

Rows carry ``train_seed``; rows without one count as ``first``. Only (attack, boundary) pairs fitted with more
than one seed have a spread; the interval over documents of each row does not include this variance.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def seed_spread(rows: list[dict[str, Any]], first: int) -> dict[tuple[str, str], dict[str, float]]:
    """Top-1 (user text) across training seeds of every (attack, boundary) fitted with more than one seed:
    ``{(attack, boundary): {"mean", "sd" (sample), "min", "max", "seeds", "values"}}``."""
    by: dict[tuple[str, str], dict[int, float]] = {}
    for r in rows:
        by.setdefault((r["attack"], r["boundary"]), {})[r.get("train_seed", first)] = \
            r["metrics"]["token_acc_top1"]["value"]
    out = {}
    for k, per_seed in by.items():
        if len(per_seed) > 1:
            v = np.asarray([per_seed[s] for s in sorted(per_seed)], dtype=float)
            out[k] = {"mean": float(v.mean()), "sd": float(v.std(ddof=1)), "min": float(v.min()),
                      "max": float(v.max()), "seeds": len(v), "values": v.tolist()}
    return out
