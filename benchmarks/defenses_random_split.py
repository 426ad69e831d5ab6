"""``random-split`` in the defenses stage: depth identification from the states alone, then end-to-end recovery.

Under ``random-split(depths=...)`` the client draws each session's head depth
(:meth:`splitinfer.defenses.random_split.RandomSplit.draw`). The serving cloud
learns the depth (it must run the right layers); what the defense can hide is
the depth from someone who holds only the states (a log, a leaked dump, a
second party). That party is measured here, adaptive in that it knows the set
of depths (issue 13, item 2: "depth identification from the states alone, then
the per-depth attacker; end-to-end recovery reported"):

1. ``depth-id`` trained on the attacker's own states at every depth of the set
   (public weights, its own draws of any wire defense) names each session's
   depth (a session is one test sequence);
2. the linear probe trained at the depth it named inverts the session
   (``white-box (learned)``: the victim runs the public weights);
3. end-to-end top-1 on user text, beside the same probes told the true depth
   (the ceiling: what identification costs the attacker).

Intervals: 95% bootstrap over documents (:func:`attacks.evaluate.score`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from attacks.base import Inversion
from attacks.boundary import Boundary
from attacks.defended import attacker_view, defend_taps
from attacks.evaluate import prior_from_taps, score
from attacks.registry import make_attack
from attacks.tapdata import Taps
from splitinfer.defenses import DefensePipeline

THREAT = "white-box (learned), adaptive"  # DESIGN.md 4: trained on public-weight states; knows the depth set only
OBSERVER = "sees the states only: no session metadata, so not the session's depth"
RECOVERY_THREAT = "white-box (learned), adaptive (depth-id, then the probe of the depth it names)"


def _claiming(taps: Taps, depth: int) -> Taps:
    """``taps`` labelled as head ``depth``: what the attacker believes them to be (the depth it named)."""
    return dataclasses.replace(taps, meta={**taps.meta, "boundary": str(Boundary("head", depth)), "depth": depth})


def _concat(parts: list[Inversion]) -> Inversion:
    return Inversion(np.concatenate([p.tokens for p in parts]), np.concatenate([p.topk for p in parts]),
                     np.concatenate([p.scores for p in parts]))


def random_split_row(loaded, spec: str, train: dict[int, Taps], test: dict[int, Taps], seed: int,
                     probe_options: dict | None = None) -> dict:
    """One ``random-split`` row: depth-id accuracy per session and per state, and end-to-end recovery.

    ``train`` / ``test``: {depth: the public model's clean taps at head depth} for every depth of the set (the
    same documents at every depth).
    """
    pipe = DefensePipeline.parse(spec)
    rs = pipe.get("random-split")
    wire = DefensePipeline([d for d in pipe.items if d.kind == "wire"])
    own = {d: defend_taps(train[d], attacker_view(wire)) for d in rs.depths}
    ident = make_attack("depth-id", model=loaded, seed=seed)
    ident.fit([own[d] for d in rs.depths])
    probes = {d: make_attack("linear-probe", model=loaded, seed=seed, **(probe_options or {})).fit(own[d])
              for d in rs.depths}
    n_seq = len(test[rs.depths[0]])
    drawn = np.array([rs.draw(i) for i in range(n_seq)])
    hits, tok_hits, toks = 0, 0, 0
    sessions, chosen, known = [], [], []
    for d in rs.depths:
        idx = np.flatnonzero(drawn == d)
        if not len(idx):
            continue
        view = defend_taps(test[d].select_sequences(idx.tolist()), wire, session0=0)
        pred = ident.identify(view)
        hits += int((pred["sequence_depth"] == d).sum())
        tok_hits += int((pred["token_depth"] == d).sum())
        toks += len(pred["token_depth"])
        named = np.asarray(pred["sequence_depth"])  # (S_d,) the depth the attacker names per session
        for s in range(len(idx)):  # one session at a time: each is inverted at the depth named for it
            one = view.select_sequences([s])
            chosen.append(probes[int(named[s])].invert(_claiming(one, int(named[s])), k=5))
            sessions.append(_claiming(one, rs.depths[0]))  # one label so that the sessions concatenate
        known.append(probes[d].invert(view, k=5))
    scored = Taps.concat(sessions)
    kw = {"vocab_size": int(loaded.config.vocab_size), "prior": prior_from_taps(train[rs.depths[0]])}
    end_to_end = score(_concat(chosen), scored, **kw)["token_acc_top1"]
    ceiling = score(_concat(known), scored, **kw)["token_acc_top1"]
    return {"defense": pipe.label, "depths": list(rs.depths), "sequences": n_seq,
            "drawn": {int(d): int((drawn == d).sum()) for d in rs.depths},
            "sequence_acc": hits / max(1, n_seq), "token_acc": tok_hits / max(1, toks),
            "chance": 1.0 / len(rs.depths), "threat_model": THREAT, "observer": OBSERVER,
            "end_to_end_top1": end_to_end, "known_depth_top1": ceiling, "recovery_threat_model": RECOVERY_THREAT}
