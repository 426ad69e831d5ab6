"""The matching attackers' beam search over positions, on hand-made state functions (no model)."""

from __future__ import annotations

import numpy as np
import torch

from attacks.recipes._match_beam import beam_match

# token -> state (d = 2); the state at t = 1 also depends on the token at t = 0 (a "prefix" effect)
TABLE = torch.tensor([[-5.0, -5.0], [1.0, 0.0], [0.0, 1.0]])


class Toy:
    """forward(src, tokens, t): state of each row = TABLE[token] + 3 x TABLE[its beam's previous token] at t = 1."""

    def __init__(self) -> None:
        self.prev = torch.zeros(0, dtype=torch.long)  # (W,) last token of each beam
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, src, tokens, t):
        self.last = (src, tokens)
        h = TABLE[tokens].clone()
        if t > 0:
            h += 3.0 * TABLE[self.prev[src]]
        return h

    def commit(self, t):
        self.prev = self.last[1].clone()


def _run(obs, width, lm=None, lam=0.0, k=3):
    toy = Toy()
    return beam_match(len(obs), lambda t: np.arange(3), toy.forward,
                      lambda h, t: -((h - obs[t]) ** 2).sum(-1) / 0.1, toy.commit, width, 2, k, lm, lam)


def test_beam_repairs_a_wrong_greedy_commit():
    # position 0 looks slightly more like token 1 than token 2; position 1 only fits the prefix token 2
    obs = torch.tensor([[0.55, 0.45], [1.0, 3.0]])
    greedy, beam = _run(obs, width=1), _run(obs, width=2)
    assert greedy.path.tolist()[0] == 1  # the greedy commit, and it cannot be undone
    assert beam.path.tolist() == [2, 1]  # the sequence likelihood prefers the other prefix
    assert beam.topk[:, 0].tolist() == beam.path.tolist()
    assert beam.rows == 3 + 2 * 3 + 0  # one live beam at t = 0, two at t = 1 (survivors re-run not counted)


class FlatLM:
    """A language-model prior: token 2 likely at the start, anything after it."""

    def __init__(self) -> None:
        self.rows = 0

    def start(self, rows):
        self.rows = rows
        return torch.log(torch.tensor([[0.01, 0.01, 0.98]]).repeat(rows, 1))

    def step(self, tokens, parents):
        return torch.where(tokens[:, None] == 0, torch.log(torch.tensor([0.01, 0.98, 0.01])),
                           torch.log(torch.tensor([1 / 3] * 3)))


def test_language_prior_tips_an_ambiguous_position():
    obs = torch.tensor([[0.5, 0.5], [-3.5, -3.5]])  # each prefix fits as well as the other
    flat = _run(obs, width=2)
    with_prior = _run(obs, width=2, lm=FlatLM(), lam=1.0)
    assert flat.path[0] == 1  # a tie: the first candidate
    assert with_prior.path.tolist() == [2, 0]  # the prior (token 2 first here) breaks the tie


def test_topk_scores_follow_the_paths_prefix():
    obs = torch.tensor([[0.0, 1.0], [0.0, 4.0]])
    res = _run(obs, width=3, k=3)
    assert res.path.tolist() == [2, 2]
    assert np.all(np.diff(res.scores[1]) <= 0) and res.scores.shape == (2, 3)


class OpeningLM:
    """A prior that ranks token 1 first and token 2 second at the start, flat afterwards."""

    def start(self, rows):
        return torch.log(torch.tensor([[0.2, 0.5, 0.3]]).repeat(rows, 1))

    def step(self, tokens, parents):
        return torch.log(torch.full((len(tokens), 3), 1 / 3))


def _hidden_first(obs, lm_top, lm=None):
    """Position 0 unseen (candidates None, no evidence), position 1 seen."""
    toy = Toy()

    def loglik(h, t):
        return torch.zeros(h.shape[0]) if t == 0 else -((h - obs[t]) ** 2).sum(-1) / 0.1

    return beam_match(len(obs), lambda t: None if t == 0 else np.arange(3), toy.forward, loglik, toy.commit, 3, 4,
                      2, lm, 1.0, lm_top)


def test_an_unseen_position_is_filled_from_the_prior_and_settled_by_the_next_seen_one():
    obs = torch.tensor([[0.0, 0.0], [1.0, 3.0]])  # t = 1 is token 1 after token 2 (the prior's second choice)
    assert _hidden_first(obs, lm_top=2, lm=OpeningLM()).path.tolist() == [2, 1]
    assert _hidden_first(obs, lm_top=1, lm=OpeningLM()).path[0] == 1  # beyond the prior's first: never tried


def test_an_unseen_position_needs_a_prior():
    import pytest

    with pytest.raises(ValueError, match="language-model prior"):
        _hidden_first(torch.zeros(2, 2), lm_top=2)
