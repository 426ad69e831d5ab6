"""Vocabulary matching under ``permute`` without the transformed body weights (``vocab-match-aligned``).

``vocab-match-adaptive`` breaks ``permute`` (a secret orthogonal basis Q: the victim releases ``h Q``) as the
cloud that runs the body: it holds ``W Q`` and the public W and solves for Q (orthogonal Procrustes). This
attacker is denied those weights (an eavesdropper on the wire, or a cloud that runs the body under secure
hardware or secret sharing, as the permutation papers' protocols intend) and aligns the released states to the
public model's from the states alone, in the spirit of weight-free alignment of arXiv 2605.04901 (as described to
us: align the states of different sessions to each other and to public-model states from their statistics; the
paper's own procedure was not read, so this is our construction):

1. **Statistics and anchors.** Q is the same for every session of a deployment, so the released states of all
   sessions are pooled: the ones it is asked to invert and, where the harness hands them over
   (:func:`attacks.defended.show_traffic`), the deployment's other sessions, up to ``traffic_tokens``. Their
   second moment is ``Q^T E[h^T h] Q``, with ``E[h^T h]`` estimated from the public model's own states of the
   attacker's text; and the leading public positions of each sequence (an added BOS,
   a chat template's system prompt and role markers: their states depend on public tokens only) are exact
   pairs ``(a_k, a_k Q)``, "anchors". ``mode=signed`` (public): a signed permutation is read off by an
   assignment on sign-free per-dimension features and the anchors' magnitudes, signs from the anchors
   (:func:`attacks.recipes._align.signed_init`). ``mode=rotation`` (``init=gram``, its default): the sessions
   are decoded left to right without Q by matching inner products, which every orthogonal Q keeps, starting
   from the anchors and growing the set of known pairs with every decoded row
   (:mod:`attacks.recipes._gram`), until the pairs span R^d (``gram_rows``, default 2d); Procrustes on them is
   Q to wire precision. ``init=statistics`` for a rotation: the second moments' eigenvectors, each sign fixed
   by the anchors and the mean (:func:`~attacks.recipes._align.eigen_init`), which pin only the leading
   directions of a Haar rotation (24.2% recovered at head 2 of the default model); it is also the fallback
   when the decoded pairs do not span R^d.
2. **Aligning the two clouds of states** (``neighbour_rounds``; skipped after a spanning ``gram`` start): pairs of
   released and public states that are each other's nearest neighbours (cosine) under the current estimate, then
   Procrustes on the pairs (snapped under ``mode=signed``): the refinement of unsupervised word-embedding alignment
   (Conneau et al., "Word Translation Without Parallel Data", arXiv 1710.04087). A token's state at a shallow depth
   is close to the same token's state in another context, so the pairs are mostly right once the estimate is
   roughly right.
3. **Self-training Procrustes** (``rounds``; after a spanning ``gram`` start only its convergence measure): turn
   the states back with the current estimate, decode every position with the ridge proposer (top-1; public
   positions keep their public token), run the public head on the decoded sequences, keep the rows that fit within
   twice the ``keep`` quantile of the rows' errors (a wrong token or prefix fits far worse than a right one under a
   nearly right Q) and solve Procrustes on them (snapped to a signed permutation under ``mode=signed``), as long as
   the update fits the decoded rows better. It has converged when at least ``min_exact`` of the user-text rows are
   reproduced to wire rounding (relative residual under ``exact_tol``), which a wrong basis cannot do (public rows
   are left out of that count: they fit under any basis that fits their few distinct states). The share is small
   where the proposer is weak, since a row is reproduced only when its token and whole prefix were decoded right:
   2.8% of about 18,000 user-text rows at head depth 8 of the default model with the exact basis, 0.0% with a wrong
   one; hence 1% by default. Decoded tokens pin Q to wire precision, which neighbours in other contexts cannot.
4. Then :class:`AdaptiveVocabMatch` matches on ``y Q^T`` as if it held Q. If the estimate did not converge, every
   position is beam-searched under the elementwise-relative likelihood (``match_tau``), as for private local
   layers, rather than waiting for an exact match that cannot come.

Threat model: white-box (exact), adaptive: the public local layers and the defense's public parameter (``mode``),
never the seed or the transformed body weights (:meth:`observe_cloud` ignores what the harness hands it).
Deviations: quantisation composed with permute is not modelled in the alignment (the residuals absorb it); the
fit report records the neighbour pairs and the share of rows reproduced exactly per round.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from attacks.errors import AttackError
from attacks.public import public_mask
from attacks.recipes._align import (eigen_init, fit_weights, mutual_neighbours, procrustes, relative_residual,
                                    signed_init, snap_signed)
from attacks.recipes._gram import gram_decode
from attacks.recipes.vocab_match_adaptive import AdaptiveVocabMatch
from attacks.registry import register_attack
from attacks.tapdata import Taps

log = logging.getLogger(__name__)


@register_attack("vocab-match-aligned")
class AlignedVocabMatch(AdaptiveVocabMatch):
    """White-box (exact), adaptive: aligns permute's secret basis from released states, then matches."""

    applies_to = ("permute",)  # the defense it is designed to break (the stage's lists)
    defaults = {**AdaptiveVocabMatch.defaults, "reference_tokens": 20000, "traffic_tokens": 20000,
                "neighbour_rounds": 5, "rounds": 8, "keep": 0.1, "exact_tol": 1e-2, "min_exact": 0.01,
                "init": "auto", "gram_rows": "auto", "gram_candidates": 256, "gram_tol": 1e-3, "gram_ratio": 0.1}

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        if self.permute is None:
            raise AttackError("vocab-match-aligned is made for permute; give defense='permute(mode=signed)' (or "
                              "mode=rotation), or use vocab-match-adaptive for other defenses")
        if not 0 < float(self.hparams["keep"]) <= 1:
            raise AttackError(f"vocab-match-aligned keep={self.hparams['keep']!r}; give a fraction in (0, 1]")
        if self.hparams["init"] not in ("auto", "gram", "statistics"):
            raise AttackError(f"vocab-match-aligned init={self.hparams['init']!r}; give auto, gram or statistics")
        self.reference: torch.Tensor | None = None  # (M, d) float64 public-model states of the attacker's text
        self.traffic: Taps | None = None  # released states of the deployment's other sessions (observe_traffic)

    def observe_traffic(self, released: Taps) -> None:
        """The victim's released states of every session the cloud served (the same Q for all); only the states
        and the public positions' tokens are read. Whole sequences up to ``traffic_tokens`` tokens are kept."""
        self.traffic = released.head_tokens(int(self.hparams["traffic_tokens"]))

    def observe_cloud(self, layer: torch.nn.Module, depth: int) -> None:
        """Ignored: this attacker does not hold the transformed body weights (its point)."""
        self.fit_report["cloud_weights_offered_and_ignored"] = True

    def _fit(self, train: Taps, val: Taps | None, trainer: Any) -> None:
        super()._fit(train, val, trainer)
        ref = self._public_view(train.spread_tokens(int(self.hparams["reference_tokens"])))
        self.reference = torch.from_numpy(np.asarray(ref.hidden, dtype=np.float64))

    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        tensors, state = super()._state()
        return {**tensors, "reference": self.reference}, state

    def _load_state(self, tensors: dict[str, Any], state: dict[str, Any]) -> None:
        super()._load_state({k: v for k, v in tensors.items() if k != "reference"}, state)
        self.reference = tensors["reference"].double()

    def _anchors(self, taps: Taps, known: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, d) public states and (K, d) released states of every sequence's leading public positions (their
        states depend on public tokens only, so the attacker computes them exactly)."""
        pub, obs = [], []
        for s, seq in taps.sequences():
            lead = _public_lead(known[seq])
            if lead:
                rows = slice(seq.start, seq.start + lead)
                run = Taps(taps.hidden[rows], taps.token_ids[rows], [lead], [0], [taps.documents[int(taps.seq_doc[s])]],
                           None, taps.meta)
                pub.append(np.asarray(self._public_view(run).hidden, dtype=np.float64))
                obs.append(np.asarray(taps.hidden[rows], dtype=np.float64))
        if not pub:
            empty = torch.zeros(0, taps.hidden_size, dtype=torch.float64)
            return empty, empty
        return torch.from_numpy(np.concatenate(pub)), torch.from_numpy(np.concatenate(obs))

    @torch.no_grad()
    def _decode(self, x: torch.Tensor, taps: Taps, known: np.ndarray) -> np.ndarray:
        """(N,) the proposer's top-1 token of each turned-back state; public positions keep their public token."""
        view = Taps(x.float().numpy(), taps.token_ids, taps.seq_lengths, taps.seq_doc, taps.documents, None,
                    taps.meta)
        emb = self.proposer.predict_embedding(view)  # (N, d_e)
        out = np.concatenate([self.proposer.scores(emb[a: a + 512]).argmax(1).numpy()
                              for a in range(0, len(emb), 512)]) if len(emb) else np.zeros(0, np.int64)
        return np.where(known, taps.token_ids, out)  # the public tokens are known; the rest are guesses

    @torch.no_grad()
    def estimate_basis(self, taps: Taps) -> torch.Tensor:
        """(d, d) float64 estimate of Q from the released states ``taps`` (every session pooled)."""
        if self.reference is None or self.proposer is None:
            raise AttackError("vocab-match-aligned: fit the attacker before inverting")
        y = torch.from_numpy(np.asarray(taps.hidden, dtype=np.float64))  # (N, d) = h Q on the wire
        known = public_mask(taps)
        signed = self.permute.mode == "signed"
        init = self.hparams["init"] if self.hparams["init"] != "auto" else ("statistics" if signed else "gram")
        q = self._gram_basis(taps, known) if init == "gram" else None
        pairs, spanned = [], q is not None  # a spanning gram start is exact: nothing to align by neighbours
        if q is None:  # from the statistics and the anchors
            a_pub, a_obs = self._anchors(taps, known)
            q = (signed_init if signed else eigen_init)(self.reference, y, a_pub, a_obs)
            self.fit_report["anchors"] = int(len(a_pub))
        for _ in range(0 if spanned else int(self.hparams["neighbour_rounds"])):  # align the clouds: neighbours
            i, j = mutual_neighbours(y @ q.T, self.reference)
            q = procrustes(self.reference[j], y[i])
            q = snap_signed(q) if signed else q
            pairs.append(int(len(i)))
        history, tol, keep = [], float(self.hparams["exact_tol"]), float(self.hparams["keep"])
        user = torch.from_numpy(~known)  # (N,) the rows whose tokens are guessed, not public

        def quality(basis: torch.Tensor, h: torch.Tensor) -> tuple[float, float]:
            """(share of user-text rows reproduced to wire rounding, minus the ``keep`` quantile of their errors):
            higher is better, compared as a tuple. Public rows are left out: they fit under any basis that fits
            their few distinct states."""
            err = relative_residual(h[user], y[user], basis) if bool(user.any()) else relative_residual(h, y, basis)
            return float((err < tol).double().mean()), -float(err.quantile(keep))

        for _ in range(int(self.hparams["rounds"])):
            guess = self._decode(y @ q.T, taps, known)
            view = Taps(taps.hidden, guess, taps.seq_lengths, taps.seq_doc, taps.documents, None, taps.meta)
            h = torch.from_numpy(np.asarray(self._public_view(view).hidden, dtype=np.float64))  # (N, d)
            if spanned:  # Q from spanning exact pairs: measured, never refitted on the proposer's guesses (a
                history.append(quality(q, h)[0])  # refit on the ~12% of rows it decodes was 0.32 off at d = 64)
                break
            new = procrustes(h, y, fit_weights(h, y, q, keep, among=user))
            new = snap_signed(new) if signed else new
            before, after = quality(q, h), quality(new, h)
            history.append(max(before, after)[0])
            if after <= before:  # the decoded rows no longer improve the fit: keep the estimate
                break
            q = new
        converged = bool(history) and history[-1] >= float(self.hparams["min_exact"])
        self.fit_report.update(init=init, neighbour_pairs=pairs, alignment_exact_rows=history,
                               alignment_converged=converged)
        log.info("vocab-match-aligned (%s, %s start): rows reproduced exactly by round %s, %s", self.permute.mode,
                 init, ", ".join(f"{r:.1%}" for r in history), "converged" if converged else "not converged")
        self.inexact = not converged  # an approximate basis matches nothing exactly: beam-search every position
        return q

    @torch.no_grad()
    def _gram_basis(self, taps: Taps, known: np.ndarray) -> torch.Tensor | None:
        """(d, d) Q from the pairs decoded by inner-product matching (:func:`attacks.recipes._gram.gram_decode`),
        or None when they do not span R^d (the statistics' estimate is used then)."""
        from attacks.recipes._beam import CausalLMPrior
        from attacks.recipes._match_beam import BeamCache
        from attacks.taps import TruncatedForward
        model = self._need_model()
        d = taps.hidden_size
        depth = int(self.meta.get("depth") or taps.meta.get("depth"))
        device = next(model.model.parameters()).device
        stack, embed = TruncatedForward(model.model, depth).eval(), model.model.get_input_embeddings()
        lm = CausalLMPrior.for_text(model)
        vocab = int(model.config.vocab_size)
        width = min(int(self.hparams["gram_candidates"]), vocab)
        now: dict[str, object] = {}

        def start() -> None:
            now["cache"], now["logp"] = BeamCache(), lm.start(1)

        def candidates(estimate):
            first = now["logp"][0].topk(width).indices.numpy()  # the public model's ranking under the prefix
            yield first
            guess = Taps(estimate().float()[None].numpy(), np.zeros(1, np.int64), [1], [0], taps.documents[:1], None,
                         taps.meta)  # the state as far as the known pairs turn it back
            order = self._candidates(self.proposer.predict_embedding(guess)[0], None, vocab, head=2 * width)
            yield order[~np.isin(order, first)][:width]  # the proposer's next, those the prior tried left out

        def states(tokens: torch.Tensor, t: int) -> torch.Tensor:
            cache = now["cache"]
            cache.src = torch.zeros(len(tokens), dtype=torch.long)  # every row extends the one decoded prefix
            h = stack.run_layers(embed(tokens.to(device))[:, None, :], torch.tensor([t]), cache, None)
            return h[:, 0].float()  # (B, d)

        def commit(token: int, t: int) -> torch.Tensor:
            h = states(torch.tensor([token]), t)[0]
            now["cache"].commit(t)
            now["logp"] = lm.step(torch.tensor([token]), torch.tensor([0]))
            return h

        ids = np.asarray(taps.token_ids, dtype=np.int64)
        seqs = sorted((rows for _, rows in taps.sequences()),  # the longest public lead first: it seeds the pool
                      key=lambda rows: (-_public_lead(known[rows]), rows.start))
        order = [(np.asarray(taps.hidden[rows], dtype=np.float64), np.where(known[rows], ids[rows], -1))
                 for rows in seqs]
        target = 2 * d if self.hparams["gram_rows"] == "auto" else int(self.hparams["gram_rows"])
        pool = gram_decode(order, start, candidates, states, commit, target, float(self.hparams["gram_tol"]),
                           float(self.hparams["gram_ratio"]))
        spans = False
        if len(pool) >= d:
            ph, py = pool.tensors()
            sv = torch.linalg.svdvals(ph)
            spans = float(sv[-1]) > 1e-6 * float(sv[0])
        self.fit_report.update(gram_rows=len(pool), gram_decoded=pool.decoded, gram_public=pool.public,
                               gram_sequences=pool.sequences, gram_stopped=pool.stopped, gram_spans=spans)
        log.info("vocab-match-aligned: %d pairs by inner-product matching (%d decoded, %d public) over %d sessions, "
                 "%s", len(pool), pool.decoded, pool.public, pool.sequences,
                 "spanning R^d" if spans else "not spanning R^d: the statistics' estimate instead")
        return procrustes(ph, py) if spans else None

    def _invert(self, taps: Taps, k: int):
        seen = taps if self.traffic is None else Taps.concat([self.traffic, taps])  # every released state it holds
        self.basis = self.estimate_basis(seen)
        return super()._invert(taps, k)


def _public_lead(known: np.ndarray) -> int:
    """(T,) bool public mask of one sequence -> how many of its leading positions are public."""
    return len(known) if known.all() else int(np.argmin(known))
