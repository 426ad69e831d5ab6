"""attacks.side_channel: features of the frames the cloud sees, and the cross-validated metadata classifier."""

import numpy as np
import pytest

from attacks.side_channel import cross_validated, session_features


def _frames(prompt: int, commits: list[int], tree: int) -> list[dict]:
    """A prefill of ``prompt`` positions, then decode frames of ``tree`` positions committing ``commits``."""
    frames, pos = [{"positions": list(range(prompt))}], prompt
    for c in commits:
        frames.append({"positions": list(range(pos, pos + tree))})
        pos += c
    return frames


def test_features_read_commits_from_positions():
    f = session_features(_frames(10, [1, 3, 1, 2, 1], tree=4))
    assert f["prompt_positions"] == 10 and f["decode_steps"] == 5
    assert f["advance_mean"] == pytest.approx(7 / 4) and f["advance_max"] == 3  # the last step's commit is unseen
    assert f["multi_token_share"] == 0.5 and f["tree_mean"] == 4 and f["tree_std"] == 0
    assert f["generated_positions"] == 11  # the last frame sends positions 17..20: 11 positions after the prompt
    seq = session_features(_frames(10, [1] * 6, tree=1))
    assert seq["advance_mean"] == 1 and seq["multi_token_share"] == 0


def test_a_session_without_a_decode_frame_is_refused():
    with pytest.raises(ValueError, match="at least one decode frame"):
        session_features(_frames(5, [], tree=1))


def test_speculation_separates_copying_from_writing_and_lengths_do_not():
    rng = np.random.default_rng(0)
    feats, labels = [], []
    for i in range(40):
        copy = i % 2
        commits = list(rng.integers(2, 5, 20)) if copy else [1] * 18 + [2, 1]
        feats.append(session_features(_frames(int(rng.integers(50, 60)), commits, tree=6)))
        labels.append(copy)
    spec = cross_validated(feats, labels, feature_set="speculation")
    assert spec["accuracy"] == 1.0 and spec["ci_low"] > 0.9  # every session right: Clopper-Pearson bound
    lengths = cross_validated(feats, labels, feature_set="lengths")
    assert spec["majority"] <= 0.55 and spec["n"] == 40
    assert lengths["threat_model"] == "white-box (learned), metadata only"


def test_identical_sessions_score_no_better_than_chance():
    feats = [session_features(_frames(20, [1, 2, 1, 1], tree=3)) for _ in range(30)]
    r = cross_validated(feats, [i % 2 for i in range(30)], feature_set="all")
    assert r["accuracy"] <= 0.6


def test_bad_labels_and_feature_sets_are_errors():
    feats = [session_features(_frames(5, [1, 1], tree=1))] * 4
    with pytest.raises(ValueError, match="both classes"):
        cross_validated(feats, [1, 1, 1, 1])
    with pytest.raises(ValueError, match="choose one of lengths, speculation, all"):
        cross_validated(feats, [0, 1, 0, 1], feature_set="timing")


def test_the_interval_resamples_groups_not_sessions():
    """Each paragraph asked two ways is one group: its two sessions are not two independent cases, so the
    bootstrap draws groups (a per-session interval of duplicated sessions is too narrow)."""
    from attacks.metrics.intervals import interval

    rng = np.random.default_rng(1)
    feats, labels, groups = [], [], []
    for i in range(30):
        noisy = session_features(_frames(int(rng.integers(40, 60)), list(rng.integers(1, 3, 12)), tree=4))
        for copy in (0, 1):  # the same metadata under both labels: a share of them is predicted wrong
            feats.append(noisy if i % 3 == 0 else session_features(
                _frames(40, [3] * 10 if copy else [1] * 12, tree=4)))
            labels.append(copy)
            groups.append(f"p{i}")
    r = cross_validated(feats, labels, groups, feature_set="speculation")
    right = np.array(r["correct"], dtype=np.float64)
    assert r["groups"] == 30 and r["n"] == 60 and 0.0 < r["accuracy"] < 1.0
    per_group = right.reshape(30, 2).sum(1)
    assert (r["ci_low"], r["ci_high"]) == interval(per_group, np.full(30, 2.0), binary=True)[1:]
    assert (r["ci_low"], r["ci_high"]) != interval(right, np.ones(60), binary=True)[1:]
