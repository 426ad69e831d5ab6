"""``local-draft``: self-speculative drafting on the local side, with a bridge standing in for the cloud body.

The client already holds the first ``a`` and last ``b`` layers, the norm and
the LM head. Drafting runs them with no round trip: for each guessed token,
head (exact, over the committed context) -> *bridge* (a cheap map standing
in for the remote middle layers, :mod:`splitinfer.decoding.bridge`) -> tail
+ LM head, autoregressively up to ``draft_budget`` tokens; the tail's KV of
the committed context comes from the *real* body outputs the client
received, so only the draft positions are approximated. Besides the greedy
chain, the runner-up token at each of the first ``alternatives`` depths is
offered as a sibling leaf (a small tree at no extra forward pass).

This is the early-exit / self-speculative family: Draft & Verify (Zhang et
al. 2023, arXiv 2309.08168: draft by skipping layers of the model itself),
Kangaroo (Liu et al. 2024, arXiv 2404.18911: a shallow sub-network plus a
lightweight adapter as the draft model) and LayerSkip (Elhoushi et al.
2024, arXiv 2404.16710: exit early, verify with the remaining layers). Our
deviation: the skipped layers are the *remote* middle of a split model, and
the stand-in is not trained with the weights but fitted from the client's
own traffic: every step the client sees the states it sends (head output)
and receives (body output), so a ridge map between them is refitted every
``refit_every`` steps (closed form, d x d), optionally warm-started from a
calibration file (``calibration``, written by ``splitinfer
draft-calibrate``). No body weights are needed.

The drafter keeps KV caches of its own (it never touches the verifier's),
catches up on the committed tokens each step from the verifier's
:class:`~splitinfer.decoding.base.StepFeedback` states, and crops its tail
cache back after drafting (head entries of drafted tokens that get accepted
are kept: they are exact). Drafting costs local compute every step, so
with ``adaptive`` on the chain grows only while the next token's estimated
acceptance (the draft's softmax probability calibrated by observed
acceptance per probability and depth bucket) pays for its draft and
verification time under ``t(T) = fixed + per_token * T`` (the measured or
given step costs, plus the measured draft time per token, or ``draft_ms``).
Inside ``combined`` (``sources=...,local-draft``) its chain and siblings are
one more candidate source with per-token confidences = draft probabilities.
It runs the model, so it cannot be replayed (``needs_model``).
"""

from __future__ import annotations

import time

import torch

from splitinfer.decoding.base import (
    Candidate,
    DecodingEnv,
    StepFeedback,
    check_positive,
    register_proposer,
)
from splitinfer.decoding.bridge import RidgeBridge
from splitinfer.decoding.combined import AcceptanceStats
from splitinfer.decoding.model_drafter import ModelDrafter
from splitinfer.errors import SplitInferError

SOURCE, ALT_SOURCE = "local-draft", "local-draft-alt"


@register_proposer("local-draft")
class LocalDraft(ModelDrafter):
    """Chains (plus runner-up siblings) drafted by head -> fitted bridge -> tail on the client."""

    def __init__(
        self,
        *,
        draft_budget: int = 8,
        alternatives: int = 2,
        calibration: str | None = None,
        ridge: float = 30.0,
        refit_every: int = 8,
        draft_ms: float | None = None,
        **sizing,  # SizingOptions
    ):
        self.budget = check_positive("draft_budget", draft_budget)
        if isinstance(alternatives, bool) or not isinstance(alternatives, int) or not 0 <= alternatives <= draft_budget:
            raise SplitInferError(f"option alternatives must be an integer in [0, draft_budget={draft_budget}], "
                                  f"got {alternatives!r}")
        self.alternatives = alternatives
        self.refit_every = check_positive("refit_every", refit_every, minimum=0)
        if isinstance(ridge, bool) or not isinstance(ridge, (int, float)) or not ridge > 0:
            raise SplitInferError(f"option ridge must be a number > 0 (penalty in samples, e.g. 30), got {ridge!r}")
        if calibration is not None and not isinstance(calibration, str):
            raise SplitInferError(f"option calibration must be a file path, got {calibration!r}")
        self.calibration, self.ridge = calibration, float(ridge)
        self._init_drafter(sizing, draft_ms)
        self._key: tuple | None = None  # (model, head layers, tail layers) the bridge and stats belong to
        self.bridge: RidgeBridge | None = None
        self._reset_caches()

    # ------------------------------------------------------------------ lifecycle
    def _reset_caches(self) -> None:
        self._hc = self._tc = None
        self._n = 0  # committed entries in both caches (the context minus its last token, once synced)
        self._head_extra: list[int] = []  # tokens whose head entries follow the committed ones (drafted)
        self._chain: list[int] = []  # the last drafted chain, its runner-ups and their probabilities
        self._alts: list[int] = []
        self._conf: list[float] = []
        self._alt_conf: list[float] = []

    def begin(self, prompt: list[int], env: DecodingEnv) -> None:
        super().begin(prompt, env)
        local = self._local(env)
        self.head, self.tail = local.head, local.tail
        self.device = next(self.head.parameters()).device
        key = (local.model_sha256, tuple(self.head.layer_indices), tuple(self.tail.layer_indices))
        if key != self._key:  # a new model or split: start the bridge and the statistics afresh
            self._key, self.stats = key, AcceptanceStats(decay=self.decay)
            dim = int(self.head.embed_tokens.weight.shape[1])
            if self.calibration:
                split = f"{len(key[1])},{len(key[2])}"
                expect = {"split": split, "num_layers": local.num_layers, "hidden_size": dim,
                          "model_sha256": local.model_sha256}
                self.bridge = RidgeBridge.load(self.calibration, expect, ridge=self.ridge)
            else:
                self.bridge = RidgeBridge(dim, self.ridge)
            self._since_fit = 0
        self._reset_caches()
        self._hc, self._tc = self.head.new_cache(), self.tail.new_cache()
        self._prompt_len = len(prompt)
        self.cost.begin(env.rtt_ms, env.bandwidth_mbps)

    def end(self, prompt, output) -> None:
        self._reset_caches()  # free the caches; the bridge and statistics carry over to the next request

    # ------------------------------------------------------------------ costs
    def _keep_going(self, probs: list[float], n_max: int) -> bool:
        """Draft one more token? Only while its expected acceptance beats the rate so far, per unit cost."""
        n = len(probs)
        if n >= n_max:
            return False
        if not self.adaptive:
            return True
        fixed, per_token, draft = self.coefficients()
        path, gain = 1.0, 1.0
        for k, p in enumerate(probs):
            path *= self.stats.estimate(SOURCE, p, k + 1)
            gain += path
        nxt = path * self.stats.estimate(SOURCE, probs[-1], n + 1)  # the last token's confidence as a proxy
        return nxt / (per_token + draft) > gain / (fixed + per_token * (n + 1) + draft * n)

    # ------------------------------------------------------------------ drafting
    @torch.no_grad()
    def _forward(self, token: int, position: int) -> torch.Tensor:  # (V,) draft probabilities
        pos = torch.tensor([position], dtype=torch.long)
        hidden = self.head(torch.tensor([[token]], device=self.device), pos, self._hc)  # (1, 1, d)
        self._head_extra.append(token)
        logits = self.tail(self.bridge(hidden), pos, self._tc)[0, -1]  # (V,)
        return torch.softmax(logits.float(), dim=-1)

    def candidates(self, context: list[int]) -> list[Candidate]:
        """The drafted chain and its runner-up siblings (empty until the caches hold the context)."""
        self._chain, self._alts, self._conf, self._alt_conf = [], [], [], []
        if self._hc is None or self._n != len(context) - 1:
            return []
        remaining = self.env.max_new_tokens - (len(context) - self._prompt_len)
        n_max = min(self.budget, remaining - 1)
        if n_max < 1:
            return []
        t0, probs, alt_probs, token = time.perf_counter(), self._conf, self._alt_conf, context[-1]
        while True:
            p = self._forward(token, self._n + len(self._chain))
            top_p, top_i = torch.topk(p, 2)
            token = int(top_i[0])
            self._chain.append(token)
            self._alts.append(int(top_i[1]))
            probs.append(float(top_p[0]))
            alt_probs.append(float(top_p[1]))
            if token in self.env.eos_ids or not self._keep_going(probs, n_max):
                break
        self._tc.crop(self._n)  # bridged entries are guesses: drop them; head entries are exact, kept for now
        n = len(self._chain)
        self._timed(1e3 * (time.perf_counter() - t0), n)
        self.sizes.append(n)
        chain = [Candidate(tuple(self._chain), tuple(probs), SOURCE, 0)]
        alts = [Candidate(tuple(self._chain[:k]) + (self._alts[k],), tuple(probs[:k]) + (alt_probs[k],), ALT_SOURCE,
                          k + 1) for k in range(min(self.alternatives, n))]
        return chain + alts

    # ------------------------------------------------------------------ learning and catching up
    def update(self, context, accepted, feedback: StepFeedback | None = None) -> None:
        self._observe_guesses(accepted)
        if self._hc is None:
            return
        if feedback is None or feedback.sent_states is None or feedback.received_states is None:
            raise SplitInferError(f"decoding {self.name!r} needs the verifier's step states (StepFeedback.sent_states"
                                  " / received_states); it only runs under the verifier, not in a replay")
        self.cost.observe(feedback.timing)
        self.bridge.observe(feedback.sent_states, feedback.received_states)
        self._since_fit += 1
        if self.refit_every and self._since_fit >= self.refit_every:
            self.bridge.fit()
            self._since_fit = 0
        self._catch_up((list(context) + list(accepted))[self._n : len(context) + len(accepted) - 1],
                       feedback.received_states[feedback.committed_rows()])

    def _observe_guesses(self, accepted: list[int]) -> None:
        """Under greedy decoding ``accepted`` is the model's own continuation: score every drafted guess against it."""
        trials = []
        for k, (tok, alt) in enumerate(zip(self._chain, self._alts)):
            if k >= len(accepted):
                break
            # the parent path (chain[:k]) matched, else the loop stopped below
            trials.append((self.stats.key(SOURCE, self._conf[k], k + 1), tok == accepted[k]))
            if k < self.alternatives:
                trials.append((self.stats.key(ALT_SOURCE, self._alt_conf[k], k + 1), alt == accepted[k]))
            if tok != accepted[k]:
                break
        if trials:
            self.stats.observe(trials)
        self._chain, self._alts, self._conf, self._alt_conf = [], [], [], []

    @torch.no_grad()
    def _catch_up(self, tokens: list[int], received: torch.Tensor) -> None:
        """Append committed ``tokens`` to the caches; ``received`` (>= len(tokens), d): their body outputs."""
        match = 0
        while match < min(len(tokens), len(self._head_extra)) and tokens[match] == self._head_extra[match]:
            match += 1
        self._hc.crop(self._n + match)
        self._head_extra = []
        if match < len(tokens):
            ids = torch.tensor([tokens[match:]], device=self.device)  # (1, m)
            self.head(ids, torch.arange(self._n + match, self._n + len(tokens)), self._hc)
        positions = torch.arange(self._n, self._n + len(tokens))
        self.tail.run_layers(received[: len(tokens)][None].to(self.device), positions, self._tc, None)
        self._n += len(tokens)
