"""The open-vocabulary backoff of the softmax attackers (attacks/recipes/_backoff.py), on tiny-model taps."""

import json

import numpy as np
import pytest
import torch

from attacks.errors import AttackError
from attacks.recipes import _backoff
from attacks.taps import extract_depths


@pytest.fixture(scope="module")
def taps(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("bo") / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"text": f"Invoice {i * 37} for client number {i} is due on day {i % 28}."})
                              for i in range(40)))
    train = extract_depths(tiny, f"file:{path}", ["head:2"], max_tokens=900, progress=False)["head:2"]
    return train.select_sequences(range(0, len(train) - 4)), train.select_sequences(range(len(train) - 4, len(train)))


def test_fit_is_shared_for_the_same_taps_and_round_trips(tiny, taps):
    train, val = taps
    backoff = _backoff.fit_backoff(tiny, train, val, seed=0)
    assert _backoff.fit_backoff(tiny, train, val, seed=0) is backoff  # memoised
    assert _backoff.fit_backoff(tiny, train, val, seed=1) is not backoff
    tensors, cfg = _backoff.state(backoff)
    assert tensors and all(k.startswith("backoff.") for k in tensors)
    again = _backoff.load(tiny, tensors, cfg, "mlp")
    assert torch.equal(again.predict_embedding(val), backoff.predict_embedding(val))
    with pytest.raises(AttackError, match="needs the model's embedding matrix"):
        _backoff.load(None, tensors, cfg, "mlp")


def test_mixture_topk_spreads_unk_mass_over_unknown_tokens_only(tiny, taps):
    train, val = taps
    backoff = _backoff.fit_backoff(tiny, train, val, seed=0)
    y = backoff.predict_embedding(val)  # (N, d_e)
    vocab = np.unique(train.token_ids)[:20]  # the "classifier's" known tokens
    n = len(y)
    all_unk = torch.full((n, len(vocab) + 1), -1e9)
    all_unk[:, -1] = 0.0  # every position: all the classifier's mass on <unk>
    ids, logp = _backoff.combine_topk(backoff, y, all_unk, vocab, tau=0.1, k=5)
    assert ids.shape == logp.shape == (n, 5)
    assert not np.isin(ids, vocab).any()  # lam = 1: only unknown tokens carry mass
    assert (np.diff(logp, axis=1) <= 1e-6).all() and np.allclose(np.exp(logp).sum(1) <= 1.0 + 1e-5, True)
    one_known = torch.full((n, len(vocab) + 1), -1e9)
    one_known[:, 3] = 0.0
    ids, logp = _backoff.combine_topk(backoff, y, one_known, vocab, tau=0.1, k=3)
    assert (ids[:, 0] == vocab[3]).all() and np.allclose(logp[:, 0], 0.0, atol=1e-5)
    mixed_ids, _ = _backoff.combine_topk(backoff, y, one_known, vocab, tau=0.1, k=3, lam=0.6)
    assert not (mixed_ids[:, 1:] == vocab[3]).any()


def test_choose_picks_from_the_grid(tiny, taps):
    train, val = taps
    backoff = _backoff.fit_backoff(tiny, train, val, seed=0)
    vocab = np.unique(train.token_ids)
    logp = torch.log_softmax(torch.randn(val.n_tokens, len(vocab) + 1, generator=torch.Generator().manual_seed(0)), 1)
    tau, lam, scores = _backoff.choose(backoff, val, logp, vocab)
    assert tau in _backoff.TAUS and lam in _backoff.LAMS
    assert len(scores) == len(_backoff.TAUS) * len(_backoff.LAMS) and all(0 <= v <= 1 for v in scores.values())
    assert scores[f"tau={tau},lam={lam}"] == max(scores.values())


def test_a_shortlist_without_unknown_tokens_is_finite_and_ranks_the_same_for_every_k(tiny, taps):
    """Regression: with every shortlisted token known, <unk>'s share divided by an empty sum gave NaN, which
    topk ranked first (duplicated ids, a top-1 that changed with k, NaN poured into lm-beam's beam)."""
    train, val = taps
    backoff = _backoff.fit_backoff(tiny, train, val, seed=0)
    y = backoff.predict_embedding(val)  # (N, d_e)
    vocab = np.arange(int(tiny.config.vocab_size))  # the classifier knows every token: no shortlist entry is unknown
    logp = torch.log_softmax(torch.randn(len(y), len(vocab) + 1, generator=torch.Generator().manual_seed(0)), 1)
    for lam in (1.0, 0.6):
        ids1, lp1 = _backoff.combine_topk(backoff, y, logp, vocab, tau=0.1, k=1, lam=lam)
        ids8, lp8 = _backoff.combine_topk(backoff, y, logp, vocab, tau=0.1, k=8, lam=lam)
        assert np.isfinite(lp8).all() and np.array_equal(ids1[:, 0], ids8[:, 0])
        assert all(len(set(row)) == 8 for row in ids8.tolist())
        if lam == 1.0:  # the classifier alone: its own ranking of the known tokens
            assert np.array_equal(ids8[:, 0], logp[:, :-1].argmax(1).numpy())
