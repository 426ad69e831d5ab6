"""``feature-draft``: token trees drafted by a small head trained on the model's own final features.

Every verified step the local tail computes the final normed state ``s``
(what the LM head sees) of every position it verified; the verifier hands
them to proposers (:attr:`StepFeedback.final_states`). The drafter keeps the
state ``s`` of the position whose logits chose the newest committed token
``x_1`` and runs the draft head (:class:`~.feature_head.FeatureHead`)
forward from it: ``s_1 = f(s, E[x_1])`` gives the logits (frozen LM head) of
the token after ``x_1``, and so on, feeding its own features and guesses
back. Drafting is a tree expansion: each depth, the ``beam`` best frontier
nodes (path score = product of calibrated acceptance estimates) are expanded
into their ``topk`` children in ONE batched call (head MLP + LM head over the
frontier), until ``max_depth`` or no frontier node scores ``min_prob``; the
``draft_budget`` best nodes (a prefix-closed tree) are proposed. Nothing is
cached but one vector, so catching up costs nothing and no KV cache is kept.

Family and citations: EAGLE (Li et al. 2024, arXiv 2401.15077: feature-level
autoregression with the token shifted by one, frozen LM head, trained on
the model's features), Hydra (Ankner et al. 2024, arXiv 2402.05109:
sequentially dependent draft heads that see the guessed tokens) and Medusa
(Cai et al. 2024, arXiv 2401.10774: light heads on the last hidden state,
tree verification). Deviations:

- the draft layer is one residual MLP, not a transformer layer (no attention
  over earlier features): context enters only through ``s``;
- features are the *normed* final states (EAGLE uses the pre-norm ones),
  since that is what the split's tail already has in hand, and the token
  embedding is RMS-normed before concatenation;
- training (:mod:`.feature_train`) uses the model's own greedy continuations
  (self-distillation, as Medusa-2's self-distillation and EAGLE's
  "feature uncertainty" unrolling), with labels = the model's argmax at every
  position, on prompts built from the project's corpora train split, never
  the benchmark prompts;
- with a vocabulary shortlist in the head file (``draft-train --vocab``,
  FR-Spec / EAGLE-3 style) only those LM-head rows are read out and the
  softmax is over them; ``shortlist=false`` reads out the whole vocabulary;
- the tree is expanded by per-depth top-k with softmax probabilities as
  confidences (EAGLE-2-like dynamic trees), calibrated online by the
  acceptance observed per (probability bucket, depth bucket), and sized by
  the step-time model like ``local-draft``.

Inside ``combined`` (``sources=...,feature-draft``) the tree's root-to-leaf
paths are one more candidate source with per-token confidences = draft
probabilities. It reads the model's states, so it cannot be replayed
(``needs_model``). ``draft_head`` is the directory written by ``splitinfer
draft-train`` (default: the cache directory it writes to for this model).
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
from splitinfer.decoding.combined import AcceptanceStats
from splitinfer.decoding.model_drafter import ModelDrafter
from splitinfer.decoding.feature_head import default_dir, load_head
from splitinfer.errors import SplitInferError

SOURCE = "feature-draft"


@register_proposer("feature-draft")
class FeatureDraft(ModelDrafter):
    """Token trees from a recurrent MLP draft head over the model's own final features (EAGLE-like)."""

    def __init__(
        self,
        *,
        draft_head: str | None = None,
        draft_budget: int = 16,
        topk: int = 3,
        beam: int = 3,
        max_depth: int = 8,
        min_prob: float = 0.02,
        shortlist: bool = True,
        **sizing,  # SizingOptions
    ):
        self.budget = check_positive("draft_budget", draft_budget)
        self.topk = check_positive("topk", topk)
        self.beam = check_positive("beam", beam)
        self.max_depth = check_positive("max_depth", max_depth)
        if isinstance(min_prob, bool) or not isinstance(min_prob, (int, float)) or not 0 <= min_prob < 1:
            raise SplitInferError(f"option min_prob must be a number in [0, 1), got {min_prob!r}")
        if draft_head is not None and not isinstance(draft_head, str):
            raise SplitInferError(f"option draft_head must be a directory path, got {draft_head!r}")
        if not isinstance(shortlist, bool):
            raise SplitInferError(f"option shortlist must be true or false, got {shortlist!r}")
        self.path, self.min_prob = draft_head, float(min_prob)
        self.use_shortlist = shortlist
        self._init_drafter(sizing)
        self._key: tuple | None = None
        self.head = None
        self.info: dict = {}
        self.draft_ms: list[float] = []  # drafting time per step (for reports)
        self._feat: torch.Tensor | None = None
        self._n = -1
        self._last: list[tuple[int, int, float, int]] = []  # (token, parent, conf, depth) of the last tree

    # ------------------------------------------------------------------ lifecycle
    def begin(self, prompt: list[int], env: DecodingEnv) -> None:
        super().begin(prompt, env)
        local = self._local(env)
        self.embed, self.tail = local.head.embed_tokens, local.tail
        weight = self.embed.weight  # (V, d)
        key = (local.model_sha256, tuple(weight.shape), self.path)
        if key != self._key:
            expect = {"model_sha256": local.model_sha256, "hidden_size": int(weight.shape[1]),
                      "vocab_size": int(weight.shape[0])}
            head, self.info = load_head(self.path or default_dir(local.model_sha256), expect)
            self.head = head.to(weight.device)
            self._key, self.stats = key, AcceptanceStats(decay=self.decay)
            short = self.head.vocab_shortlist if self.use_shortlist else None
            self._short = short  # (K,) token ids the draft may propose, or None for all
            lm = self.tail.lm_head.weight
            self._readout = lm if short is None else lm.index_select(0, short).contiguous()  # (K or V, d)
        self._feat, self._n, self._last = None, -1, []
        self._prompt_len = len(prompt)
        self.cost.begin(env.rtt_ms, env.bandwidth_mbps)

    def end(self, prompt, output) -> None:
        self._feat, self._n, self._last = None, -1, []

    # ------------------------------------------------------------------ drafting
    @torch.no_grad()
    def _expand(self, feats: torch.Tensor, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One batched draft call: feats (F, d), tokens (F,) -> next features (F, d), top-k probs / ids (F, k)."""
        ids = torch.tensor(tokens, device=feats.device)  # (F,)
        nxt = self.head(feats, self.embed(ids).float())  # (F, d)
        logits = torch.nn.functional.linear(nxt.to(self._readout.dtype), self._readout).float()  # (F, K or V)
        if self.tail.softcap:
            logits = torch.tanh(logits / self.tail.softcap) * self.tail.softcap
        probs = torch.softmax(logits, dim=-1)  # over the draft vocabulary
        top_p, top_i = torch.topk(probs, min(self.topk, probs.shape[-1]), dim=-1)  # (F, k)
        if self._short is not None:
            top_i = self._short[top_i]  # shortlist rows -> token ids
        return nxt, top_p.cpu(), top_i.cpu()

    def _tree(self, context: list[int], n_max: int) -> list[tuple[int, int, float, int, float]]:
        """Expanded nodes (token, parent, conf, depth, path score); parents index this list, -1 = root."""
        nodes: list[tuple[int, int, float, int, float]] = []
        frontier = [(-1, self._feat[None], context[-1], 1.0)]  # (node, feature that predicted it (1, d), token, score)
        eos = self.env.eos_ids
        for depth in range(1, self.max_depth + 1):
            feats = torch.cat([f for _, f, _, _ in frontier])  # (F, d)
            nxt, top_p, top_i = self._expand(feats, [t for _, _, t, _ in frontier])
            new = []
            for f, (node, _, _, score) in enumerate(frontier):
                for c in range(top_p.shape[1]):
                    p, tok = float(top_p[f, c]), int(top_i[f, c])
                    s = score * self.stats.estimate(SOURCE, p, depth)
                    nodes.append((tok, node, p, depth, s))
                    if tok not in eos:
                        new.append((len(nodes) - 1, nxt[f : f + 1], tok, s))
            if len(nodes) >= n_max:  # a child can only enter the n_max best if it beats the n_max-th score
                floor = sorted((n[4] for n in nodes), reverse=True)[n_max - 1]
            else:
                floor = 0.0
            frontier = [x for x in sorted(new, key=lambda x: -x[3])[: self.beam]
                        if x[3] >= self.min_prob and x[3] > floor]
            if not frontier:
                break
        return nodes

    def candidates(self, context: list[int]) -> list[Candidate]:
        """Root-to-leaf paths of the best ``draft_budget`` nodes, confidences = draft probabilities."""
        self._last = []
        if self._feat is None or self._n != len(context):
            return []
        remaining = self.env.max_new_tokens - (len(context) - self._prompt_len)
        n_max = min(self.budget, remaining - 1)
        if n_max < 1:
            return []
        t0 = time.perf_counter()
        nodes = self._tree(context, n_max)
        keep = sorted(sorted(range(len(nodes)), key=lambda i: (-nodes[i][4], nodes[i][3], i))[:n_max])
        kept = set(keep)
        has_child = {nodes[i][1] for i in keep}
        out = []
        for i in sorted((i for i in keep if i not in has_child), key=lambda i: -nodes[i][4]):  # leaves, best first
            path = []
            while i >= 0:
                assert i in kept  # scores never grow down a path: the kept nodes are prefix-closed
                path.append(i)
                i = nodes[i][1]
            path.reverse()
            out.append(Candidate(tuple(nodes[j][0] for j in path), tuple(nodes[j][2] for j in path), SOURCE, len(out)))
        index = {i: k for k, i in enumerate(keep)}
        self._last = [(nodes[i][0], -1 if nodes[i][1] < 0 else index[nodes[i][1]], nodes[i][2], nodes[i][3])
                      for i in keep]
        self.draft_ms.append(1e3 * (time.perf_counter() - t0))
        self._timed(self.draft_ms[-1], len(keep))
        self.sizes.append(len(keep))
        return out

    # ------------------------------------------------------------------ learning
    def update(self, context, accepted, feedback: StepFeedback | None = None) -> None:
        self._observe(accepted)
        if self.head is None:
            return
        if feedback is None or feedback.final_states is None:
            raise SplitInferError(f"decoding {self.name!r} needs the verifier's final states "
                                  "(StepFeedback.final_states); it only runs under the verifier, not in a replay")
        self.cost.observe(feedback.timing)
        row = feedback.chooser_row(len(accepted))
        self._feat = feedback.final_states[row].detach().float()  # (d,)
        self._n = len(context) + len(accepted)

    def _observe(self, accepted: list[int]) -> None:
        """Score every node of the last tree whose parent path the model took (``accepted`` = its tokens)."""
        on_path = {-1}
        trials = []
        for i, (tok, parent, conf, depth) in enumerate(self._last):  # topological: parents first
            if parent in on_path and depth <= len(accepted):
                ok = tok == accepted[depth - 1]
                trials.append((self.stats.key(SOURCE, conf, depth), ok))
                if ok:
                    on_path.add(i)
        if trials:
            self.stats.observe(trials)
        self._last = []
