"""White-box exact inversion by vocabulary matching (``vocab-match``).

With the head's weights the prompt can be recovered exactly, left to right:
the state at position t is a deterministic function of tokens 0..t, so once
tokens 0..t-1 are known, try candidate tokens v at position t and keep the
one whose head output matches the observed state. This is the vocabulary
matching / SipIt family of white-box inversions: Nikolaou et al., "Language
Models Are Injective and Hence Invertible" (ICLR 2026, arXiv 2510.15511;
SipIt: sequential, position-by-position exact inversion with gradient-guided
candidates), and the split-LLM prompt inversion attacks of Qu et al.,
"Prompt Inversion Attack against Collaborative Inference of Large Language
Models" (arXiv 2503.09022; embedding optimisation + token matching). Because
the map is injective in practice, accuracy is ~100% at any depth.

Per position t: the head runs ONE forward of the last position for a batch of
candidates, on a KV cache holding the recovered prefix (expanded over the
batch, never copied into the cache); the candidate with the smallest
distance to the observed state wins (:func:`match_distance`: the RMS of the
elementwise relative error ``(h(v) - h_obs) / (|h_obs| + median|h_obs|)``,
so that the few massive-activation dimensions -- norms of 2e4 at position 0
after 16 layers of the default model -- do not drown the others; plain
relative L2 separates tokens there by only 0.4%). A candidate within ``tol``
is accepted at once. Candidates, in order:

1. the top of a proposer's ranking (``batch_sizes``, default 8 then 64): a
   ``linear-embed`` ridge map fitted on ``proposer_tokens`` of the training taps (whole sequences spread over
   the pool, so every corpus is in it: :meth:`~attacks.tapdata.Taps.spread_tokens`) plus
   ``random_tokens`` head states of uniformly random token sequences (a
   white-box attacker makes such pairs for free; they cover rare tokens), and
   optionally, first, another learned attacker's top-k (:meth:`set_proposer`);
2. gradient-guided candidates as in SipIt: descend on a continuous input
   embedding at position t (Adam, ``grad_steps``) to match the observed state,
   and every ``grad_check`` steps try the ``grad_topk`` tokens nearest to it;
3. the rest of the vocabulary in the proposer's order, ``max_batch`` at a time
   (up to ``max_candidates``, default all); if nothing is within ``tol`` the
   nearest candidate is taken and counted as not accepted. When that rest is
   uncapped and fits in one batch (a vocabulary of at most ``max_batch`` plus
   the first guesses) step 2 is skipped: one batched forward over it is
   cheaper than the gradient steps and certain to hold the token.

With the whole vocabulary scanned the true token is always found (its
distance is ~1e-4 on fp16 states at depths 1-16). Only a ``max_candidates``
cap can make a position miss; the recovered prefix is then wrong, so no later
position of that sequence can match either. Those later positions
(``after_miss``) take the nearest of the proposer's first guesses and skip
steps 2-3, which would scan the capped vocabulary in vain at every position
(that cascade is what made a capped run at depth 16 take an hour). After a
full scan without a match the nearest token is the best guess there is, and
the search goes on normally.

Public positions (chat-template tokens and tokenizer-added special tokens,
:func:`attacks.public.public_mask`; ``public_known``, default on) are known to
the cloud (DESIGN.md section 4): their token is taken into the prefix without
a search (one forward for its cache entry). They are never scored as user text.

The nearest-match rule makes it robust to fp16 wire rounding (measured
distance of the true token ~1e-4 on fp16 states, of the nearest other token
>= 4e-2, on the default model at depths 1-16). ``info`` reports seconds per
token, candidates, forwards and gradient steps per token, and the acceptance
rate. Deviation: sequences are inverted independently from position 0 (as
the taps were extracted); no backtracking after a wrong acceptance.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from attacks.base import Inversion, InversionAttack
from attacks.errors import AttackError
from attacks.public import public_mask
from attacks.registry import make_attack, register_attack
from attacks.tapdata import Taps

log = logging.getLogger(__name__)


def match_distance(h: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
    """(B, d) candidate states, (d,) observed state -> (B,) RMS elementwise relative error (0 = identical).

    ``obs`` may also be (B, d): one observed state per row (each scaled by its own median).
    """
    scale = obs.abs() + obs.abs().median(dim=-1, keepdim=True).values + 1e-12  # (d,) or (B, d)
    return ((h - obs) / scale).pow(2).mean(dim=-1).sqrt()


class _PrefixCache:
    """KV cache of the recovered prefix that serves a batch of B one-token candidates (duck-types PartKVCache)."""

    def __init__(self) -> None:
        self.keys: dict[int, torch.Tensor] = {}  # layer -> (1, H_kv, S, D_h)
        self.values: dict[int, torch.Tensor] = {}
        self.new: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> candidates' (B, H_kv, 1, D_h) k, v
        self.positions = torch.zeros(0, dtype=torch.long)  # (S,)

    def __len__(self) -> int:
        return int(self.positions.numel())

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return len(self)

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        self.new[layer_idx] = (key, value)
        if layer_idx not in self.keys:
            return key, value
        b = key.shape[0]
        k = torch.cat([self.keys[layer_idx].expand(b, -1, -1, -1), key], dim=2)  # (B, H_kv, S+1, D_h)
        v = torch.cat([self.values[layer_idx].expand(b, -1, -1, -1), value], dim=2)
        return k, v

    def append_positions(self, positions: torch.Tensor) -> None:
        pass  # the prefix grows only by commit()

    def candidate_kv(self, j: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        return {layer: (k[j: j + 1].clone(), v[j: j + 1].clone()) for layer, (k, v) in self.new.items()}

    def commit(self, kv: dict[int, tuple[torch.Tensor, torch.Tensor]], position: int) -> None:
        for layer, (k, v) in kv.items():
            if layer in self.keys:
                self.keys[layer] = torch.cat([self.keys[layer], k], dim=2)
                self.values[layer] = torch.cat([self.values[layer], v], dim=2)
            else:
                self.keys[layer], self.values[layer] = k, v
        self.positions = torch.cat([self.positions, torch.tensor([position])])


@register_attack("vocab-match")
class VocabMatch(InversionAttack):
    """White-box exact inversion: match each observed state against the head's output for candidate tokens."""

    threat_model = "white-box (exact)"
    requires = frozenset({"head_weights"})
    boundary_side = "head"
    proposer_recipe = "linear-probe"  # the harness fits this recipe on the same boundary and passes it to set_proposer
    scoring = "prefixes"  # seconds per token on CPU: scored on sequence prefixes (scoring_subset)
    defaults = {"tol": 5e-3, "batch_sizes": [8, 64], "max_batch": 512, "max_candidates": None,
                "proposer": "linear-embed", "proposer_tokens": 20000, "random_tokens": 8192, "grad_steps": 100,
                "grad_check": 5, "grad_topk": 16, "grad_lr": 0.15, "public_known": True}

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        if self.hparams["proposer"] not in ("linear-embed", "none"):
            raise AttackError(f"vocab-match proposer={self.hparams['proposer']!r}; choose linear-embed or none "
                              "(and add any learned attacker with set_proposer)")
        self.proposer = None
        self.extra = None  # another fitted attack whose top-k goes first

    def set_proposer(self, attack: InversionAttack | None) -> None:
        """Try ``attack``'s top-k guesses first at every position (any fitted attacker on the same boundary)."""
        self.extra = attack

    # ------------------------------------------------------------ fit / persistence
    def _fit(self, train: Taps, val: Taps | None, trainer: Any) -> None:
        self._need_model()
        if self.hparams["proposer"] == "linear-embed":
            data = train.spread_tokens(int(self.hparams["proposer_tokens"]))  # every corpus, not the first
            if int(self.hparams["random_tokens"]) > 0:
                data = Taps.concat([data, self._random_taps(train, int(self.hparams["random_tokens"]))])
            self.proposer = make_attack("linear-embed", model=self.model, seed=self.seed)
            self.proposer.fit(data, val)
            self.fit_report["proposer_val_top1"] = self.proposer.fit_report.get("val_top1")

    @torch.no_grad()
    def _random_taps(self, like: Taps, n_tokens: int, length: int = 64) -> Taps:
        """Head states of uniformly random token sequences: white-box pairs covering the whole vocabulary."""
        from attacks.taps import TruncatedForward

        model = self.model
        depth = int(like.meta.get("depth") or 0)
        if depth < 1:
            raise AttackError("vocab-match needs taps that record their depth (meta['depth'])")
        stack = TruncatedForward(model.model, depth).eval()
        gen = torch.Generator().manual_seed(self.seed)
        ids = torch.randint(0, int(model.config.vocab_size), (max(1, n_tokens // length), length), generator=gen)
        device = next(model.model.parameters()).device
        hidden = torch.cat([stack(ids[a: a + 8].to(device)).reshape(-1, like.hidden_size).cpu()
                            for a in range(0, len(ids), 8)])  # (n, d)
        docs = [{"doc_id": f"random-{i}", "genre": "random", "text": "", "pii_spans": []} for i in range(len(ids))]
        return Taps(hidden.numpy().astype(like.hidden.dtype), ids.reshape(-1).numpy(), np.full(len(ids), length),
                    np.arange(len(ids)), docs, None, dict(like.meta))

    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        if self.proposer is None:
            return {}, {"proposer": None}
        tensors, state = self.proposer._state()
        return {f"proposer.{k}": v for k, v in tensors.items()}, {"proposer": self.proposer.config() | {"state": state}}

    def _load_state(self, tensors: dict[str, Any], state: dict[str, Any]) -> None:
        cfg = state.get("proposer")
        if cfg is None:
            return
        self.proposer = make_attack(cfg["recipe"], model=self.model, seed=cfg.get("seed", 0), **cfg["hparams"])
        self.proposer.meta.update(cfg.get("meta", {}))
        self.proposer.fit_report = dict(cfg.get("fit_report", {}))
        self.proposer._load_state({k[9:]: v for k, v in tensors.items() if k.startswith("proposer.")}, cfg["state"])
        self.proposer.fitted = True

    # ------------------------------------------------------------ inversion
    def observed_view(self, h: torch.Tensor) -> torch.Tensor:
        """(B, d) candidate states -> (B, d') what the attacker observes of a state: the state itself here;
        ``query-match`` observes the first body layer's queries. Differentiable (the gradient search descends
        through it)."""
        return h

    def distance(self, h: torch.Tensor, obs: torch.Tensor, t: int | None = None) -> torch.Tensor:
        """(B, d) candidate states, (d,) observed at position ``t`` -> (B,) distances; adaptive subclasses model
        the defense (a clip calibrated per position needs ``t``)."""
        return match_distance(self.observed_view(h), obs)

    def scan_cap(self, vocab: int) -> int | None:
        """The most candidates one position's scan may score, as this attack is configured; None when it may
        reach the whole vocabulary (results record it, so a miss can be told from a capped scan's)."""
        cap = self.hparams["max_candidates"]
        return None if cap is None or int(cap) >= vocab else int(cap)

    def _sequences(self, taps: Taps):
        """``taps.sequences()`` with a progress bar on long runs (the head-8 exact matcher runs for minutes, the
        beam for tens of them), quiet under 256 tokens."""
        return tqdm(list(taps.sequences()), desc=self.name, unit="seq", leave=False, disable=taps.n_tokens < 256)

    def _orders(self, taps: Taps) -> tuple[torch.Tensor | None, np.ndarray | None]:
        """Proposer's predicted embeddings (N, d_e) or None, and the extra attacker's top-k (N, 16) or None."""
        extra = self.extra.invert(taps, 16).topk if self.extra is not None else None
        if self.proposer is None:
            return None, extra
        return self.proposer.predict_embedding(taps), extra

    def _candidates(self, y: torch.Tensor | None, extra_row: np.ndarray | None, vocab: int,
                    head: int | None = None) -> np.ndarray:
        """Candidate order for one position: extra top-k, then the proposer's ranking (or id order).

        With ``head``, only about the first ``head`` candidates (a cheap top-k instead of a full sort).
        """
        if y is None:
            order = np.arange(vocab if head is None else min(head, vocab))
        else:
            sc = self.proposer.scores(y[None])[0]  # (V,)
            order = (sc.argsort(descending=True) if head is None else sc.topk(min(head, vocab)).indices).numpy()
        if extra_row is None:
            return order
        first = np.asarray(list(dict.fromkeys(int(t) for t in extra_row if 0 <= t < vocab)), dtype=np.int64)
        return np.concatenate([first, order[~np.isin(order, first)]])

    def _try(self, ctx: dict[str, Any], cand: np.ndarray) -> bool:
        """Run one candidate batch at the current position; update the best match; True when accepted."""
        cand = cand[~ctx["tried"][cand]]
        if cand.size == 0:
            return False
        ctx["tried"][cand] = True
        ids = torch.as_tensor(cand, device=ctx["device"])  # (B,)
        h = ctx["stack"].run_layers(ctx["embed"](ids)[:, None, :], ctx["pos"], ctx["cache"], None)  # (B, 1, d)
        dist = self.distance(h[:, 0].float(), ctx["obs"], int(ctx["pos"][0]))  # (B,)
        ctx["forwards"] += 1
        ctx["ids"].append(cand)
        ctx["dists"].append(dist.cpu().numpy())
        j = int(dist.argmin())
        if float(dist[j]) < ctx["best"]:
            ctx["best"], ctx["best_kv"] = float(dist[j]), ctx["cache"].candidate_kv(j)
        return ctx["best"] < self.hparams["tol"]

    def _gradient_search(self, ctx: dict[str, Any], init: torch.Tensor) -> bool:
        """Descend on a continuous input embedding to match the state; test its nearest tokens as it moves."""
        hp = self.hparams
        e = init.detach().clone().to(ctx["device"]).requires_grad_(True)  # (d_e,)
        opt = torch.optim.Adam([e], lr=float(hp["grad_lr"]) * ctx["emb_std"])
        for step in range(1, int(hp["grad_steps"]) + 1):
            with torch.enable_grad():
                h = ctx["stack"].run_layers(e[None, None, :], ctx["pos"], ctx["cache"], None)  # (1, 1, d)
                loss = match_distance(self.observed_view(h[:, 0].float()), ctx["obs"]).pow(2).sum()
                (grad,) = torch.autograd.grad(loss, [e])
            e.grad = grad
            opt.step()
            ctx["grad_steps"] += 1
            if step % int(hp["grad_check"]) == 0:
                d = ((ctx["emb"] - e.detach()) ** 2).sum(1)  # (V,)
                d[torch.from_numpy(ctx["tried"])] = float("inf")
                near = d.topk(int(hp["grad_topk"]), largest=False).indices.cpu().numpy()
                if self._try(ctx, near):
                    return True
        return False

    @torch.no_grad()
    def _invert(self, taps: Taps, k: int) -> Inversion:
        from attacks.taps import TruncatedForward

        model = self._need_model()
        hp = self.hparams
        if taps.n_tokens > 1 and len(taps) == taps.n_tokens and len(set(taps.seq_doc.tolist())) < len(taps):
            log.warning("vocab-match got one-token sequences from longer documents (Taps.select_tokens?): each is "
                        "matched at position 0 without its prefix, which fails and is slow; pass whole sequences "
                        "(Taps.head_tokens or Taps.truncate)")
        depth = int(self.meta.get("depth") or taps.meta.get("depth"))
        device = next(model.model.parameters()).device
        emb = model.model.get_input_embeddings().weight.detach()  # (V, d_e)
        vocab = int(model.config.vocab_size)
        limit = int(hp["max_candidates"] or vocab)
        sizes = [int(x) for x in hp["batch_sizes"]]
        ys, extra = self._orders(taps)
        n = taps.n_tokens
        topk, scores = np.zeros((n, k), dtype=np.int64), np.zeros((n, k), dtype=np.float32)
        scanned, forwards, accepted = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, bool)
        grad_used, grad_steps = np.zeros(n, bool), np.zeros(n, np.int64)
        base = {"stack": TruncatedForward(model.model, depth).eval(), "embed": model.model.get_input_embeddings(),
                "device": device, "emb": emb, "emb_std": float(emb.float().std())}
        t0 = time.perf_counter()
        after_miss = np.zeros(n, bool)  # positions behind a miss in their sequence: their prefix is wrong
        # public positions (chat template, added special tokens) are known to the cloud: taken, not searched
        known = public_mask(taps) if hp.get("public_known", True) else np.zeros(n, bool)
        for _, rows in self._sequences(taps):
            cache, missed = _PrefixCache(), False
            for pos, row in enumerate(range(rows.start, rows.stop)):
                obs = torch.as_tensor(np.asarray(taps.hidden[row], dtype=np.float32), device=device)  # (d,)
                y_row, x_row = None if ys is None else ys[row], None if extra is None else extra[row]
                order = self._candidates(y_row, x_row, vocab, head=sum(sizes))[:limit]
                if known[row]:
                    order = np.asarray([int(taps.token_ids[row])])
                ctx = {**base, "cache": cache, "obs": obs, "pos": torch.tensor([pos]), "tried": np.zeros(vocab, bool),
                       "ids": [], "dists": [], "best": float("inf"), "best_kv": None, "forwards": 0, "grad_steps": 0}
                done, a = False, 0
                for size in sizes:  # the proposer's first guesses
                    done, a = self._try(ctx, order[a: a + size]), a + size
                    if done:
                        break
                after_miss[row] = missed  # behind a miss no candidate can match: keep the nearest first guess
                skip = missed or bool(known[row])
                # an uncapped rest of the vocabulary that fits in one scan batch costs one batched forward and is
                # sure to hold the token: cheaper than any gradient search (a small vocabulary, e.g. a test model's)
                rest_in_one_batch = limit == vocab and vocab - a <= int(hp["max_batch"])
                if not done and not skip and not rest_in_one_batch and int(hp["grad_steps"]) > 0:  # SipIt-style
                    grad_used[row] = True
                    init = ys[row] if ys is not None else emb.float().mean(0)
                    done = self._gradient_search(ctx, init)
                if not done and not skip:
                    order = self._candidates(y_row, x_row, vocab)[:limit]
                    while not done and a < len(order):  # fall back to the rest of the vocabulary
                        done, a = self._try(ctx, order[a: a + int(hp["max_batch"])]), a + int(hp["max_batch"])
                ids, dists = np.concatenate(ctx["ids"]), np.concatenate(ctx["dists"])
                done = done or bool(known[row])
                scanned[row], forwards[row], accepted[row] = len(ids), ctx["forwards"], done
                missed = missed or (not done and len(ids) < vocab)  # a capped scan left the true token out
                grad_steps[row] = ctx["grad_steps"]
                if not done or ctx["forwards"] > len(sizes):
                    log.debug("position %d: %d candidates, %d gradient steps, best distance %.2e (%s)", pos, len(ids),
                              ctx["grad_steps"], ctx["best"], "accepted" if done else "not accepted")
                rank = np.argsort(dists, kind="stable")[:k]
                got, dist_k = ids[rank], dists[rank]
                if len(got) < k:  # pad with untried candidates in proposer order (beyond any cap)
                    pad = self._candidates(y_row, x_row, vocab, head=len(ids) + k)
                    more = pad[~ctx["tried"][pad]][: k - len(got)]
                    got = np.concatenate([got, more])
                    dist_k = np.concatenate([dist_k, np.full(k - len(dist_k), np.inf)])
                topk[row], scores[row] = got, -np.minimum(dist_k, 1e30)
                cache.commit(ctx["best_kv"], pos)
        seconds = time.perf_counter() - t0
        info = {"seconds": round(seconds, 3), "seconds_per_token": seconds / max(n, 1),
                "accepted_rate": float(accepted.mean()), "mean_candidates": float(scanned.mean()),
                "forwards_per_token": float(forwards.mean()), "gradient_search_rate": float(grad_used.mean()),
                "mean_gradient_steps": float(grad_steps.mean()), "tol": float(hp["tol"]),
                "misses": int((~accepted & ~after_miss).sum()), "after_miss_rate": float(after_miss.mean())}
        log.info("vocab-match depth %d: %.4f s/token, %.1f%% accepted, %.1f candidates/token, gradient search at "
                 "%.1f%% of positions", depth, info["seconds_per_token"], 100 * info["accepted_rate"],
                 info["mean_candidates"], 100 * info["gradient_search_rate"])
        return Inversion(topk[:, 0], topk, scores, info)


def scoring_subset(test: Taps, rows: dict[str, tuple[int, int]], per_corpus: int, pii_tokens: int,
                   n_seqs: int = 4) -> Taps:
    """The test subset vocab-match is scored on (it costs forwards per token, so it is scored on a sample).

    ``rows``: corpus -> (first, end) token rows of ``test``. Keeps ``n_seqs`` sequences of each corpus cut to
    ``per_corpus / n_seqs`` tokens, plus, for corpora with PII spans, their first two sequences cut to
    ``pii_tokens`` (so that spans are covered and PII recovery can be scored). Whole-sequence prefixes, never
    single token rows: position t can only be matched once tokens 0..t-1 are recovered. The sequences come from
    as many documents as there are (:func:`spread_sequences`): intervals are bootstrapped over documents, and
    four chunks of one long document gave none.
    """
    starts = test.seq_starts()
    short, long = [], []
    for lo, hi in rows.values():
        first = int(np.searchsorted(starts, lo))
        seqs = spread_sequences(test, [s for s in range(first, len(test)) if starts[s] < hi], n_seqs)
        has_pii = any(test.documents[int(test.seq_doc[s])].get("pii_spans") for s in seqs)
        long += seqs[:2] if has_pii and pii_tokens > 0 else []
        short += seqs[2:] if has_pii and pii_tokens > 0 else seqs
    parts = [test.select_sequences(short).truncate(max(1, per_corpus // n_seqs))]
    if long:
        parts.append(test.select_sequences(long).truncate(pii_tokens))
    return Taps.concat(parts)


def spread_sequences(test: Taps, seqs: list[int], n: int) -> list[int]:
    """``n`` of ``seqs`` (sequence indices, in order): the first sequence of each document first, then the
    rest in order when there are fewer than ``n`` documents; returned in their original order."""
    firsts, seen = [], set()
    for s in seqs:
        doc = int(test.seq_doc[s])
        if doc not in seen:
            seen.add(doc)
            firsts.append(s)
    chosen = firsts[:n]
    chosen += [s for s in seqs if s not in set(chosen)][: n - len(chosen)]
    return sorted(chosen)
