"""Benchmark of the matching attackers' search on a real model: s/token and recovery per setting (prints JSON lines).

Run: ``PYTHONPATH=. python -m benchmarks.match_search '<json>'`` with keys ``depths`` (head depths), ``specs``
(defense specs; a noise spec without ``clip=`` gets the median state norm, as in the defenses stage),
``attacks`` (a list of ``[recipe, options]``), optional ``model`` (default ``default``), ``scored`` (prefix tokens
per corpus, default 32, cut from ``sequences`` sequences of different documents per corpus, default 4, of the
first ``test_tokens`` test-split tokens per corpus, default 300), ``corpora`` (default prose and chat),
``repeats`` (sessions for ``session-average``, default ``[1]``), ``traffic`` (test-split tokens per corpus whose
released states an attack with ``observe_traffic`` sees, default 10000). Each line: depth,
defense, attack, options, repeats, user-text top-1 with its bootstrap CI over documents, n, documents and
seconds per token of the inversion (the fit apart). Speed figures in docs/defenses.md come from here.
"""

from __future__ import annotations

import json
import logging
import sys
import time

import numpy as np
import torch

from attacks.base import Inversion
from attacks.defended import as_public, attacker_view, defend_taps, resent_taps, show_traffic, victim_model
from attacks.evaluate import prior_from_taps, score
from attacks.recipes.vocab_match import scoring_subset
from attacks.registry import make_attack
from attacks.tapdata import Taps
from benchmarks.stage_defenses import median_clip, split_taps
from splitinfer.defenses import DefensePipeline
from splitinfer.defenses.base import format_items
from splitinfer.models import load_model

# the quick suite's proposer options when docs/defenses.md's speed figures were measured
BASE = {"proposer_tokens": 4000, "random_tokens": 2048}
NO_PROPOSER = ("relaxed-inversion",)


def run(args: dict) -> list[dict]:
    depths, scored = [int(a) for a in args["depths"]], int(args.get("scored", 32))
    traffic = int(args.get("traffic", 10000))
    loaded = load_model(args.get("model", "default"))
    cfg = {"corpora": args.get("corpora", ["prose", "chat"]), "max_length": 64}
    train, _ = split_taps(loaded, cfg, depths, "train", 2000)
    test, rows = split_taps(loaded, cfg, depths, "test", int(args.get("test_tokens", 300)))
    out = []
    for a in depths:
        for spec in args["specs"]:
            pipe = DefensePipeline.parse(spec)
            if pipe.get("noise") is not None and "clip=" not in spec:
                pipe = DefensePipeline.parse(spec, {"noise.clip": median_clip(train[a])})
            victim = test[a]
            if pipe.model_items:  # private local layers: the victim's own head states
                got, _ = split_taps(victim_model(loaded, pipe, a), cfg, [a], "test", int(args.get("test_tokens", 300)))
                victim = as_public(got[a], loaded)
            clean = scoring_subset(victim, rows[a], scored, 0, int(args.get("sequences", 4)))
            target, own = defend_taps(clean, pipe), defend_taps(train[a], attacker_view(pipe))
            for recipe, opts in args["attacks"]:
                hp = {**({} if recipe in NO_PROPOSER else BASE), **opts}
                atk = make_attack(recipe, model=loaded, seed=0, defense=format_items(pipe.items, public=True), **hp)
                t0 = time.perf_counter()
                atk.fit(own)
                if hasattr(atk, "observe_traffic"):  # the deployment's other sessions: the whole test split's states
                    show_traffic(atk, lambda: defend_taps(split_taps(loaded, cfg, [a], "test", traffic)[0][a], pipe))
                fit_s = time.perf_counter() - t0
                for r in (args.get("repeats", [1]) if hasattr(atk, "invert_sessions") else [None]):
                    t0 = time.perf_counter()
                    inv = atk.invert_sessions(resent_taps(clean, pipe, r), k=5) if r else atk.invert(target, k=5)
                    sec = time.perf_counter() - t0
                    m = score(inv, target, vocab_size=int(loaded.config.vocab_size),
                              prior=prior_from_taps(train[a]))["token_acc_top1"]
                    line = {"depth": a, "defense": pipe.label, "attack": recipe, "options": opts, "repeats": r,
                            "top1": m["value"], "ci": [m["ci_low"], m["ci_high"]], "n": m["n"],
                            **_seen_apart(atk, inv, target, int(loaded.config.vocab_size)),
                            "documents": len(set(target.seq_doc.tolist())), "tokens_inverted": int(target.n_tokens),
                            "s_per_token": round(sec / max(1, target.n_tokens), 4), "fit_s": round(fit_s, 1),
                            "estimated_noise_std": inv.info.get("estimated_noise_std"),
                            "fit": {k: v for k, v in atk.fit_report.items() if isinstance(v, (bool, int, float, str))}}
                    print(json.dumps(line), flush=True)
                    out.append(line)
    return out


def _seen_apart(atk, inv: Inversion, target: Taps, vocab: int) -> dict:
    """For an attacker that sees only some positions (``shard-infill``): top-1 on those it sees and on the rest."""
    if not hasattr(atk, "visible_rows"):
        return {}
    out, seen = {}, atk.visible_rows(target)
    for name, rows in (("seen", seen), ("unseen", ~seen)):
        idx = np.flatnonzero(rows)
        sub = Inversion(inv.tokens[idx], inv.topk[idx], inv.scores[idx], inv.info)
        m = score(sub, target, vocab_size=vocab, rows=idx)["token_acc_top1"]
        out[f"top1_{name}"], out[f"ci_{name}"], out[f"n_{name}"] = m["value"], [m["ci_low"], m["ci_high"]], m["n"]
    return out


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("attacks.recipes.vocab_match_aligned").setLevel(logging.INFO)
    torch.set_num_threads(int(json.loads(sys.argv[1]).get("threads", 1)))
    run(json.loads(sys.argv[1]))
