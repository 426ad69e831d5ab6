"""Hand-made checks of attacks.metrics.core, the bootstrap and summarize (pure functions, no model)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attacks import metrics as M

# -- token accuracy -----------------------------------------------------------

TRUE = [np.array([1, 2, 3, 4]), np.array([5, 6])]
TOPK = [
    np.array([[1, 9, 9], [9, 2, 9], [9, 9, 3], [9, 9, 9]]),  # top1: 1/4, top2: 2/4, top3: 3/4
    np.array([[5, 0, 0], [0, 0, 6]]),  # top1: 1/2, top3: 2/2
]


def test_token_accuracy_topk_hand_example():
    c1, n1 = M.token_accuracy_topk(TRUE, TOPK, 1)
    c2, _ = M.token_accuracy_topk(TRUE, TOPK, 2)
    c3, _ = M.token_accuracy_topk(TRUE, TOPK, 3)
    assert n1.tolist() == [4, 2]
    assert c1.tolist() == [1, 1]
    assert c2.tolist() == [2, 1]
    assert c3.tolist() == [3, 2]
    assert c3.sum() / n1.sum() == pytest.approx(5 / 6)


def test_token_accuracy_accepts_1d_top1_and_lists():
    c, n = M.token_accuracy_topk([[1, 2, 3]], [[1, 0, 3]], 1)
    assert (c.tolist(), n.tolist()) == ([2], [3])


def test_token_accuracy_empty_document_counts_zero():
    c, n = M.token_accuracy_topk([np.array([], dtype=int), [7]], [np.zeros((0, 2), int), [[7, 1]]], 2)
    assert c.tolist() == [0, 1] and n.tolist() == [0, 1]


@pytest.mark.parametrize(
    "true, topk, k, match",
    [
        (TRUE, TOPK, 0, "k must be"),
        (TRUE, TOPK, 4, "fewer than k=4"),
        (TRUE, TOPK[:1], 1, "has 2 documents but topk_ids has 1"),
        ([], [], 1, "empty"),
        ([np.array([1, 2])], [np.array([[1], [2], [3]])], 1, "3 positions but the true sequence has 2"),
        ([np.array([1.5])], [np.array([[1]])], 1, "integer"),
    ],
)
def test_token_accuracy_bad_inputs(true, topk, k, match):
    with pytest.raises(ValueError, match=match):
        M.token_accuracy_topk(true, topk, k)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_topk_accuracy_monotone_in_k(data):
    n_docs = data.draw(st.integers(1, 4))
    kmax = data.draw(st.integers(1, 6))
    true, topk = [], []
    for _ in range(n_docs):
        t = data.draw(st.integers(0, 8))
        true.append(np.array(data.draw(st.lists(st.integers(0, 9), min_size=t, max_size=t)), dtype=np.int64))
        flat = data.draw(st.lists(st.integers(0, 9), min_size=t * kmax, max_size=t * kmax))
        topk.append(np.array(flat, dtype=np.int64).reshape(t, kmax))
    prev = np.zeros(n_docs, dtype=np.int64)
    for k in range(1, kmax + 1):
        c, n = M.token_accuracy_topk(true, topk, k)
        assert (c >= prev).all() and (c <= n).all()
        prev = c


# -- F1 and exact match -------------------------------------------------------


def test_token_f1_known_multisets():
    f1 = M.token_f1(
        [[1, 1, 2, 3], [1, 2], [4, 5], [], [], [3, 3, 3]],
        [[1, 2, 2], [2, 1], [6, 7], [], [1], [3]],
    )
    # doc0: overlap {1, 2} = 2; P = 2/3, R = 2/4 -> F1 = 2*2/(4+3) = 4/7
    expected = [4 / 7, 1.0, 0.0, 1.0, 0.0, 2 * 1 / (3 + 1)]
    assert f1 == pytest.approx(expected)


id_lists = st.lists(st.integers(0, 6), max_size=12)


@settings(max_examples=80, deadline=None)
@given(id_lists, id_lists)
def test_token_f1_symmetric_bounded_and_one_iff_same_multiset(a, b):
    ab = M.token_f1([a], [b])[0]
    ba = M.token_f1([b], [a])[0]
    assert ab == pytest.approx(ba)
    assert 0.0 <= ab <= 1.0
    assert (ab == pytest.approx(1.0)) == (sorted(a) == sorted(b))


def test_exact_match():
    em = M.exact_match([[1, 2], [1, 2], [1, 2], []], [[1, 2], [2, 1], [1, 2, 3], []])
    assert em.tolist() == [True, False, False, True]


def test_f1_mismatched_docs():
    with pytest.raises(ValueError, match="pred_ids has 1"):
        M.token_f1([[1], [2]], [[1]])


# -- PII ----------------------------------------------------------------------

# text: "Call John Smith at 555-1234"
#        0123456789...
# tokens: "Call"(0,4) " John"(4,9) " Smith"(9,15) " at"(15,18) " 555"(18,22) "-"(22,23) "1234"(23,27)
PII_TRUE = np.array([10, 11, 12, 13, 14, 15, 16])
PII_OFFSETS = np.array([[0, 4], [4, 9], [9, 15], [15, 18], [18, 22], [22, 23], [23, 27]])
PII_SPANS = [
    {"start": 5, "end": 15, "type": "name"},  # tokens 1, 2
    {"start": 19, "end": 27, "type": "phone"},  # tokens 4, 5, 6
]


def test_pii_span_recovered_iff_all_overlapping_tokens_correct():
    pred = PII_TRUE.copy()
    pred[0] = 99  # outside every span
    pred[5] = 99  # inside the phone span
    assert M.pii_spans_recovered(PII_TRUE, pred, PII_OFFSETS, PII_SPANS) == [True, False]
    assert M.pii_spans_recovered(PII_TRUE, PII_TRUE, PII_OFFSETS, PII_SPANS) == [True, True]
    wrong_boundary = PII_TRUE.copy()
    wrong_boundary[4] = 99  # " 555" only partly overlaps the phone span: still required
    assert M.pii_spans_recovered(PII_TRUE, wrong_boundary, PII_OFFSETS, PII_SPANS) == [True, False]


def test_pii_span_outside_tokens_not_scored_and_special_tokens_ignored():
    offsets = np.array([[0, 0], [0, 4], [4, 9]])  # a BOS token with an empty range
    true = np.array([1, 2, 3])
    pred = np.array([0, 2, 3])  # BOS wrong: must not matter
    spans = [{"start": 0, "end": 4, "type": "name"}, {"start": 20, "end": 30, "type": "email"}]
    assert M.pii_spans_recovered(true, pred, offsets, spans) == [True, None]


def test_pii_recovery_counts_per_type_over_documents():
    pred_bad = PII_TRUE.copy()
    pred_bad[2] = 0  # name wrong
    per_doc = M.pii_recovery_per_doc(
        [PII_TRUE, PII_TRUE], [PII_TRUE, pred_bad], [PII_OFFSETS, PII_OFFSETS], [PII_SPANS, PII_SPANS]
    )
    assert {k: (r.tolist(), t.tolist()) for k, (r, t) in per_doc.items()} == {"name": ([1, 0], [1, 1]),
                                                                           "phone": ([1, 1], [1, 1])}
    per_doc = M.pii_recovery_per_doc([PII_TRUE], [PII_TRUE], [PII_OFFSETS], [PII_SPANS[:1]])
    rec, tot = per_doc["name"]
    assert rec.tolist() == [1] and tot.tolist() == [1]


@pytest.mark.parametrize(
    "span, match",
    [
        ({"start": 5, "end": 5, "type": "name"}, "start < end"),
        ({"start": 5, "type": "name"}, "'start', 'end' and 'type'"),
        ({"start": 0, "end": 3, "type": ""}, "non-empty string"),
    ],
)
def test_pii_bad_spans(span, match):
    with pytest.raises(ValueError, match=match):
        M.pii_recovery_per_doc([PII_TRUE], [PII_TRUE], [PII_OFFSETS], [[span]])


def test_pii_bad_offsets_shape():
    with pytest.raises(ValueError, match=r"document 0: offsets must have shape \(7, 2\)"):
        M.pii_recovery_per_doc([PII_TRUE], [PII_TRUE], [PII_OFFSETS[:3]], [PII_SPANS])


# -- baselines ----------------------------------------------------------------


def test_uniform_baseline():
    assert M.uniform_baseline(100, 1) == pytest.approx(0.01)
    assert M.uniform_baseline(100, 5) == pytest.approx(0.05)
    assert M.uniform_baseline(3, 5) == 1.0
    with pytest.raises(ValueError, match="vocab_size"):
        M.uniform_baseline(0, 1)
    with pytest.raises(ValueError, match="k must be"):
        M.uniform_baseline(10, 0)


def test_unigram_prior_baseline():
    train = [np.array([7, 7, 7, 3, 3, 1]), np.array([3, 2])]  # counts: 7:3, 3:3, 2:1, 1:1
    test = [np.array([7, 3, 1, 5]), np.array([2, 2])]
    # top-1: tie 7 vs 3 -> smaller id 3 wins: test hits 1 of 6
    assert M.unigram_prior_baseline(train, test, 1) == pytest.approx(1 / 6)
    # top-2: {3, 7} -> 2 of 6; top-3: {3, 7, 1} (1 < 2) -> 3 of 6
    assert M.unigram_prior_baseline(train, test, 2) == pytest.approx(2 / 6)
    assert M.unigram_prior_baseline(train, test, 3) == pytest.approx(3 / 6)
    # a flat training array gives the same answer
    assert M.unigram_prior_baseline(np.concatenate(train), test, 2) == pytest.approx(2 / 6)
    assert M.unigram_prior_baseline([7, 7, 3], test, 1) == pytest.approx(1 / 6)
    with pytest.raises(ValueError, match="train_token_ids is empty"):
        M.unigram_prior_baseline([], test, 1)


# -- bootstrap ----------------------------------------------------------------


def _docs(n, rng):
    den = rng.integers(5, 30, size=n)
    num = rng.binomial(den, 0.7)
    return num, den


def test_bootstrap_ci_contains_point_estimate_and_shrinks():
    rng = np.random.default_rng(1)
    widths = []
    for n in (20, 500):
        num, den = _docs(n, rng)
        value, low, high = M.bootstrap_ci(num, den, n_boot=500, seed=0)
        assert value == pytest.approx(num.sum() / den.sum())
        assert low <= value <= high
        widths.append(high - low)
    assert widths[1] < widths[0] / 2


def test_bootstrap_ci_deterministic_under_seed():
    num, den = _docs(50, np.random.default_rng(2))
    a = M.bootstrap_ci(num, den, n_boot=300, seed=7)
    b = M.bootstrap_ci(num, den, n_boot=300, seed=7)
    c = M.bootstrap_ci(num, den, n_boot=300, seed=8)
    assert a == b
    assert a[0] == c[0] and a[1:] != c[1:]


def test_bootstrap_ci_degenerate_cases():
    assert M.bootstrap_ci([3], [4]) == (0.75, 0.75, 0.75)  # one document
    assert M.bootstrap_ci([1, 1, 1], [1, 1, 1], n_boot=50) == (1.0, 1.0, 1.0)
    value, low, high = M.bootstrap_ci([0, 2], [0, 4], n_boot=200)  # empty docs are fine
    assert value == 0.5 and low == high == 0.5


@pytest.mark.parametrize(
    "num, den, kwargs, match",
    [
        ([], [], {}, "at least one document"),
        ([1, 2], [1], {}, "2 numerators but 1 denominators"),
        ([0, 0], [0, 0], {}, "sum to zero"),
        ([1], [2], {"n_boot": 0}, "n_boot"),
        ([1], [2], {"alpha": 1.0}, "alpha"),
        ([1], [-2], {}, ">= 0"),
        ([np.nan], [2], {}, "finite"),
    ],
)
def test_bootstrap_ci_bad_inputs(num, den, kwargs, match):
    with pytest.raises(ValueError, match=match):
        M.bootstrap_ci(num, den, **kwargs)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10), st.integers(0, 10)), min_size=1, max_size=15))
def test_bootstrap_ci_ordered(pairs):
    den = np.array([max(a, b) for a, b in pairs])
    num = np.array([min(a, b) for a, b in pairs])
    if den.sum() == 0:
        return
    value, low, high = M.bootstrap_ci(num, den, n_boot=100, seed=0)
    assert 0.0 <= low <= high <= 1.0
    assert 0.0 <= value <= 1.0


# -- summarize ----------------------------------------------------------------


def test_summarize_hand_example():
    train = [np.array([10, 10, 11])]
    out = M.summarize(
        [PII_TRUE, np.array([10, 11])],
        [np.stack([PII_TRUE] + [np.zeros(7, int)] * 4, axis=1), np.array([[10, 1, 2, 3, 4], [0, 1, 2, 3, 11]])],
        offsets=[PII_OFFSETS, np.array([[0, 3], [3, 6]])],
        spans=[PII_SPANS, [{"start": 0, "end": 3, "type": "name"}]],
        vocab_size=1000,
        train_token_ids=train,
        n_boot=200,
    )
    assert set(out) == {
        "token_acc_top1",
        "token_acc_top5",
        "token_f1",
        "exact_match",
        "pii_recovery_name",
        "pii_recovery_phone",
        "baseline_uniform_top1",
        "baseline_uniform_top5",
        "baseline_unigram_top1",
        "baseline_unigram_top5",
        "baseline_unigram_exact_match",
        "baseline_unigram_pii_recovery_name",
        "baseline_unigram_pii_recovery_phone",
        "lift_token_acc_top1",
        "lift_token_acc_top5",
        "lift_exact_match",
        "lift_pii_recovery_name",
        "lift_pii_recovery_phone",
        "coverage",
    }
    assert out["token_acc_top1"]["value"] == pytest.approx(8 / 9)
    assert out["token_acc_top1"]["n"] == 9
    assert out["token_acc_top5"]["value"] == 1.0
    assert out["exact_match"]["value"] == 0.5 and out["exact_match"]["n"] == 2
    assert out["token_f1"]["value"] == pytest.approx((1.0 + 0.5) / 2)
    assert out["pii_recovery_name"]["value"] == pytest.approx(2 / 2)
    assert out["pii_recovery_phone"]["n"] == 1
    assert out["baseline_uniform_top5"]["value"] == pytest.approx(0.005)
    assert out["baseline_uniform_top5"]["ci_low"] is None
    assert out["baseline_unigram_top1"]["value"] == pytest.approx(2 / 9)  # id 10 appears in both docs
    assert out["baseline_unigram_top1"]["kind"] == "info"
    assert out["lift_token_acc_top1"]["value"] == pytest.approx(8 / 9 - 2 / 9)
    assert out["coverage"]["value"] == pytest.approx(4 / 9)  # ids 10 and 11 (4 of 9 test tokens) were seen in training
    for entry in out.values():
        assert set(entry) == {"value", "ci_low", "ci_high", "n", "higher_is_better", "kind"}
        if entry["ci_low"] is not None:
            assert entry["ci_low"] <= entry["value"] <= entry["ci_high"]


def test_summarize_skips_top5_with_one_guess_and_validates():
    out = M.summarize([[1, 2, 3]], [[1, 2, 0]], n_boot=10)
    assert "token_acc_top5" not in out
    assert out["token_acc_top1"]["value"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="both offsets and spans"):
        M.summarize([[1]], [[1]], offsets=[[[0, 1]]])
    with pytest.raises(ValueError, match="no tokens"):
        M.summarize([[]], [[]])


def test_summarize_empty_document_does_not_hide_top5():
    out = M.summarize([[], [1, 2]], [[], [[0, 0, 0, 0, 1], [2, 0, 0, 0, 0]]], n_boot=10)
    assert out["token_acc_top5"]["value"] == 1.0
    assert out["token_acc_top1"]["value"] == 0.5
    assert out["exact_match"]["value"] == 0.0 and out["exact_match"]["n"] == 1  # an empty document is not scored
