"""lm-beam: beam search over a learned attacker's candidates with the public model as a language prior."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attacks.errors import AttackError
from attacks.recipes._beam import beam_decode
from attacks.registry import load_attack, make_attack
from attacks.tapdata import Taps
from attacks.train import attack_options
from tests.attacks.synth import embedding_taps


class ScriptedLM:
    """A prior that is certain of one sequence per row group: log p = 0 on ``script[s, t]``, -50 elsewhere."""

    def __init__(self, script: np.ndarray, beam: int, vocab: int):
        self.script, self.beam, self.vocab, self.t = script, beam, vocab, 0

    def _lp(self, rows: int) -> torch.Tensor:
        out = torch.full((rows, self.vocab), -50.0)
        if self.t < self.script.shape[1]:
            out[torch.arange(rows), torch.from_numpy(self.script[np.arange(rows) // self.beam, self.t])] = 0.0
        return out

    def start(self, rows: int) -> torch.Tensor:
        self.t = 0
        return self._lp(rows)

    def step(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        self.t += 1
        return self._lp(len(tokens))


def _candidates(s: int = 3, t: int = 7, k: int = 4, vocab: int = 30, seed: int = 0):
    rng = np.random.default_rng(seed)
    ids = np.stack([[rng.choice(vocab, k, replace=False) for _ in range(t)] for _ in range(s)])  # (S, T, K)
    logp = torch.log_softmax(torch.from_numpy(rng.normal(size=(s, t, k))), -1).numpy()
    return ids, logp, np.array([t, t - 2, 1])


def test_lam_zero_is_the_attackers_argmax() -> None:
    ids, logp, lengths = _candidates()
    script = np.random.default_rng(1).integers(0, 30, size=ids.shape[:2])
    path = beam_decode(ids, logp, lengths, ScriptedLM(script, 3, 30), lam=0.0, beam=3)
    best = np.take_along_axis(ids, logp.argmax(-1)[..., None], -1)[..., 0]  # (S, T)
    for s, n in enumerate(lengths):
        assert np.array_equal(path[s, :n], best[s, :n]) and (path[s, n:] == -1).all()


def test_a_certain_prior_is_followed_among_the_candidates() -> None:
    ids, logp, lengths = _candidates()
    pick = np.random.default_rng(2).integers(0, 4, size=ids.shape[:2])
    script = np.take_along_axis(ids, pick[..., None], -1)[..., 0]  # a candidate at every position, rarely the argmax
    path = beam_decode(ids, logp, lengths, ScriptedLM(script, 2, 30), lam=5.0, beam=2)
    for s, n in enumerate(lengths):
        assert np.array_equal(path[s, :n], script[s, :n])


@pytest.fixture(scope="module")
def taps(tiny):
    rng = np.random.default_rng(0)
    return (embedding_taps(tiny, rng.choice(200, 600), seed=0, noise=0.6),
            embedding_taps(tiny, rng.choice(200, 200), seed=1, noise=0.6),
            embedding_taps(tiny, rng.choice(200, 200), seed=2, noise=0.6))


def test_lm_beam_on_the_tiny_model_fits_decodes_and_round_trips(tiny, taps, tmp_path) -> None:
    train, val, test = taps
    opts = attack_options(["base=linear-probe", "base.epochs=5", "base.lr=0.01", "base.backoff=none",
                           "candidates=4", "beam=2", "lams=0.5"])
    beam = make_attack("lm-beam", model=tiny, **opts).fit(train, val)
    assert beam.hparams["base_options"] == {"epochs": 5, "lr": 0.01, "backoff": "none"}
    assert set(beam.fit_report["lam_val_top1"]) == {"0.0", "0.5"}
    inv = beam.invert(test)
    assert inv.topk.shape == (test.n_tokens, 5) and np.array_equal(inv.topk[:, 0], inv.tokens)
    assert np.isin(inv.tokens, beam.base.invert(test, k=4).topk).all()  # the path stays among the candidates
    again = load_attack(beam.save(tmp_path / "beam"), model=tiny)
    assert again.lam == beam.lam and np.array_equal(again.invert(test).tokens, inv.tokens)
    fixed = make_attack("lm-beam", model=tiny, lam=0, candidates=4, beam=2)
    fixed.set_proposer(beam.base)
    assert np.array_equal(fixed.fit(train).invert(test).tokens, beam.base.invert(test).tokens)  # lam 0: argmax


@pytest.mark.parametrize("opts, message", [
    ({"base": "vocab-match"}, "is not a learned per-token attacker"),
    ({"base": "nope"}, "unknown attack 'nope'"),
    ({"beam": 9, "candidates": 4}, "beam=9 exceeds candidates=4"),
    ({"lam": -1}, "give lam=auto or a number >= 0"),
    ({"lams": ["a"]}, "give lam=auto or a number >= 0"),
    ({"beam": 0}, "beam=0; give an integer >= 1"),
    ({"base.nope": 1}, "has no hyper-parameter"),
])
def test_bad_options_are_one_line_errors(tiny, taps, opts, message) -> None:
    with pytest.raises(AttackError, match=message) as e:
        atk = make_attack("lm-beam", model=tiny, **opts)
        atk.fit(taps[0], taps[1])  # base options are checked when the base is built
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("opts, message", [
    ({"freeze_skip": "maybe"}, "seq-decoder freeze_skip='maybe' must be true or false"),
    ({"patience": 0}, "patience=0; give the epochs"),
])
def test_seq_decoder_schedule_options_are_checked(opts, message) -> None:
    with pytest.raises(AttackError, match=message):
        make_attack("seq-decoder", **opts)


def test_options_parse_from_the_command_line() -> None:
    assert attack_options(["freeze_skip=false", "patience=100", "output=tied"]) == {
        "freeze_skip": False, "patience": 100, "output": "tied"}
    with pytest.raises(AttackError, match="write KEY=VALUE"):
        attack_options(["freeze_skip"])


def test_the_causal_prior_matches_a_full_forward_after_reordering(tiny) -> None:
    from attacks.recipes._beam import CausalLMPrior

    seqs = torch.tensor([[5, 9, 11], [7, 3, 2]])  # (R, T)
    lm = CausalLMPrior(tiny.model, 257)
    lm.start(2)
    lm.step(seqs[:, 0].flip(0), torch.tensor([0, 1]))  # rows swapped: row 0 holds seqs[1] for now
    got = lm.step(seqs[:, 1], torch.tensor([1, 0]))  # swap back while extending
    with torch.no_grad():
        full = torch.log_softmax(tiny.model(torch.cat([torch.full((2, 1), 257), seqs[:, :2]], 1)).logits[:, -1], -1)
    assert torch.allclose(got, full, atol=1e-4)


def test_a_right_prior_never_lowers_accuracy_over_a_backoff_base(tiny) -> None:
    """Regression: a base with the embedding backoff whose classifier knows every token gave NaN candidate
    scores (see test_backoff); the beam set them to -1e9, so a prior certain of the truth could not pick a true
    token the base ranked first, and lm-beam scored far below its own lam = 0. A right prior must follow the
    truth wherever it is a candidate, across the sequence starts and the padding of unequal lengths."""
    rng = np.random.default_rng(3)
    vocab = int(tiny.config.vocab_size)
    train = embedding_taps(tiny, np.tile(np.arange(vocab), 3)[:770], seed=0, noise=0.6)  # every token known
    flat = embedding_taps(tiny, rng.choice(vocab, 90), seed=1, noise=0.6)
    lens = np.array([10, 7, 4] * 4 + [6])  # unequal lengths: the decoder pads its batch
    test = Taps(flat.hidden, flat.token_ids, lens, np.arange(13) % len(flat), flat.documents, None, flat.meta)
    base = make_attack("linear-probe", model=tiny, epochs=3, lr=0.01, backoff="embed", min_count=1).fit(train)
    beam = make_attack("lm-beam", model=tiny, lam=1.0, candidates=4, beam=2, batch_sequences=48)
    beam.set_proposer(base)
    beam.fit(train)
    order = np.argsort(-lens, kind="stable")  # the decoder's batch order
    truth = np.zeros((len(test), int(lens.max())), dtype=np.int64)
    for i, s in enumerate(order):
        truth[i, : lens[s]] = test.token_ids[test.seq_starts()[s]: test.seq_starts()[s + 1]]
    beam._prior = lambda: ScriptedLM(truth, 2, vocab)  # a prior certain of every sequence
    cand = base.invert(test, k=4).topk  # (N, 4)
    path = beam.invert(test).tokens
    hit = (cand == test.token_ids[:, None]).any(1)
    assert hit.any() and np.array_equal(path[hit], test.token_ids[hit])
    assert (path == test.token_ids).mean() >= (cand[:, 0] == test.token_ids).mean()


def test_batching_of_sequences_does_not_change_the_paths(tiny, taps) -> None:
    train, _, test = taps
    base = make_attack("linear-probe", model=tiny, epochs=3, lr=0.01, backoff="none").fit(train)
    paths = []
    for batch in (3, 48):
        atk = make_attack("lm-beam", model=tiny, lam=0.5, candidates=4, beam=2, batch_sequences=batch)
        atk.set_proposer(base)
        paths.append(atk.fit(train).invert(test).tokens)
    assert np.array_equal(*paths)
