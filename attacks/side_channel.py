"""The metadata side channel: what the cloud learns from a session's frames without reading a single state.

DESIGN.md section 4 lets the semi-honest cloud keep positions, draft tree
shapes, message sizes and timing. Speculative decoding makes these depend on
the text: a step that commits several tokens means the drafts (copied from the
prompt, earlier output or the token-recycling table) were right, which happens
far more on repetitive or copied text than on new prose. This module turns one
session's forward frames, as the cloud receives them, into features and scores
a classifier of a session property (code or chat? copying or writing?) from
them, cross-validated over sessions.

Feature sets (each session's frames in order; the first is the prefill):

- ``lengths``: what a sequential client also reveals: the prompt's positions
  and the generated length (last position reached minus the prompt).
- ``speculation``: what speculative decoding adds, scale-free: per decode step
  the *advance* (first position of the next frame minus this frame's first
  position: tokens committed by the step; always 1 when sequential) and the
  tree size (positions sent): their mean, spread, maximum, and the share of
  steps that committed 2 or more tokens.
- ``all``: both, plus the number of decode steps.

The attacker labels sessions it generates itself with the public model and the
same decoding (it knows both), so it is ``white-box (learned)`` on metadata
only. Scoring: scikit-learn logistic regression on standardised features,
k-fold cross-validation with sessions grouped (a group's sessions share a
fold), every session predicted once by a model that never saw it; accuracy
with its 95% interval (:func:`attacks.metrics.intervals.interval`, the groups
as the units: a paragraph's two prompts are not two independent cases) beside
the majority-class rule under the same folds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attacks.metrics.intervals import interval

LENGTHS = ("prompt_positions", "generated_positions")
SPECULATION = ("advance_mean", "advance_std", "advance_max", "multi_token_share", "tree_mean", "tree_std")
FEATURE_SETS = {"lengths": LENGTHS, "speculation": SPECULATION, "all": (*LENGTHS, *SPECULATION, "decode_steps")}
THREAT_MODEL = "white-box (learned), metadata only"


def session_features(frames: Sequence[dict]) -> dict[str, float]:
    """One session's forward frames (``{"positions": [int, ...]}``, in order, the prefill first) -> features."""
    if len(frames) < 2:
        raise ValueError(f"a session needs its prefill and at least one decode frame to be described; got "
                         f"{len(frames)} frame(s)")
    prompt = len(frames[0]["positions"])
    decode = frames[1:]
    starts = np.array([min(f["positions"]) for f in decode], dtype=np.float64)  # (S,)
    advance = np.diff(starts)  # (S-1,) tokens committed by each decode step but the last
    tree = np.array([len(f["positions"]) for f in decode], dtype=np.float64)  # (S,)
    last = max(max(f["positions"]) for f in frames) + 1
    adv = advance if len(advance) else np.ones(1)
    return {"prompt_positions": float(prompt), "generated_positions": float(last - prompt),
            "decode_steps": float(len(decode)), "advance_mean": float(adv.mean()), "advance_std": float(adv.std()),
            "advance_max": float(adv.max()), "multi_token_share": float((adv >= 2).mean()),
            "tree_mean": float(tree.mean()), "tree_std": float(tree.std())}


def _folds(groups: np.ndarray, labels: np.ndarray, k: int, seed: int) -> list[np.ndarray]:
    from sklearn.model_selection import StratifiedGroupKFold

    k = min(k, len(np.unique(groups)))
    splitter = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
    return [test for _, test in splitter.split(np.zeros(len(labels)), labels, groups)]


def cross_validated(features: Sequence[dict], labels: Sequence[int], groups: Sequence | None = None,
                    feature_set: str = "all", k: int = 5, seed: int = 0) -> dict:
    """Cross-validated accuracy of a metadata classifier and of the majority rule, with 95% intervals.

    ``labels``: 0/1 per session; ``groups``: sessions that must share a fold (e.g. the same paragraph asked
    two ways); None puts each session in its own group.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if feature_set not in FEATURE_SETS:
        raise ValueError(f"feature set {feature_set!r}; choose one of {', '.join(FEATURE_SETS)}")
    y = np.asarray(labels, dtype=np.int64)  # (n,)
    if len(y) != len(features) or set(np.unique(y).tolist()) != {0, 1}:
        raise ValueError("cross_validated needs one 0/1 label per session and both classes present")
    names = FEATURE_SETS[feature_set]
    x = np.array([[f[n] for n in names] for f in features], dtype=np.float64)  # (n, F)
    g = np.asarray(groups if groups is not None else np.arange(len(y)))
    right, majority = np.zeros(len(y)), np.zeros(len(y))
    for test in _folds(g, y, k, seed):
        train = np.setdiff1d(np.arange(len(y)), test)
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000, random_state=seed))
        clf.fit(x[train], y[train])
        right[test] = clf.predict(x[test]) == y[test]
        majority[test] = y[test] == int(np.bincount(y[train], minlength=2).argmax())
    _, unit = np.unique(g, return_inverse=True)  # (n,) the group of each session: the bootstrap's unit
    size = np.bincount(unit).astype(np.float64)  # (G,)
    acc, lo, hi = interval(np.bincount(unit, weights=right), size, binary=True, seed=seed)
    base, blo, bhi = interval(np.bincount(unit, weights=majority), size, binary=True, seed=seed)
    return {"feature_set": feature_set, "features": list(names), "accuracy": acc, "ci_low": lo, "ci_high": hi,
            "majority": base, "majority_ci_low": blo, "majority_ci_high": bhi, "n": int(len(y)),
            "groups": int(len(size)), "correct": right.astype(int).tolist(), "threat_model": THREAT_MODEL}
