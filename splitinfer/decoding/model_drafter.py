"""The base of the proposers that draft with the model's own parts: ``local-draft`` and ``feature-draft``.

Both run client-side model pieces lent by the verifier (``env.local``), so
neither can be replayed (``needs_model``); both estimate the acceptance of
their guesses online per (confidence bucket, depth bucket) (:class:`AcceptanceStats`),
merge their candidates into a tree (:mod:`.merge`) and size it with one
step-cost model (:class:`~splitinfer.timing.StepCostModel`). Drafting time
is already spent when the tree is sized, so sizing uses the verification
cost only; :meth:`ModelDrafter.coefficients` reports all three figures the
same way for both, ``(fixed_ms, per_token_ms, draft_ms per drafted token)``.
"""

from __future__ import annotations

from splitinfer.decoding.base import Candidate, DecodingEnv, Draft, LocalModules, Proposer, SizingOptions
from splitinfer.decoding.combined import AcceptanceStats
from splitinfer.decoding.merge import best_size, merge_candidates, ranked_nodes, select
from splitinfer.errors import SplitInferError


class ModelDrafter(Proposer):
    """Shared lifecycle of the model-drafting proposers (see the module docstring)."""

    needs_model = True

    def _init_drafter(self, sizing: dict, draft_ms: float | None = None) -> None:
        """Set up sizing from the constructor's ``**sizing`` options (:class:`SizingOptions`) and ``draft_ms``."""
        if draft_ms is not None and (isinstance(draft_ms, bool) or not isinstance(draft_ms, (int, float))
                                     or not 0 <= draft_ms < float("inf")):
            raise SplitInferError(f"option draft_ms must be a number >= 0 (ms per drafted token), got {draft_ms!r}")
        opts = SizingOptions(**sizing)
        self.adaptive, self.decay = bool(opts.adaptive), float(opts.decay)
        self.cost = opts.cost_model()
        self.stats = AcceptanceStats(decay=self.decay)
        self.fixed_draft_ms = None if draft_ms is None else float(draft_ms)
        self.draft_token_ms = 15.0  # running mean of drafting time per drafted token (ms)
        self.sizes: list[int] = []  # nodes drafted per step (for reports)

    def _local(self, env: DecodingEnv) -> LocalModules:
        if env.local is None:
            raise SplitInferError(f"decoding {self.name!r} drafts with the local model: run it through "
                                  "SplitModel.generate / splitinfer generate (it cannot be replayed without the model)")
        return env.local

    def _timed(self, ms: float, n: int) -> None:
        """Record one draft: ``ms`` spent on ``n`` drafted tokens."""
        if n > 0:
            self.draft_token_ms = 0.8 * self.draft_token_ms + 0.2 * ms / n

    def coefficients(self) -> tuple[float, float, float]:
        """(fixed_ms, per_token_ms, draft_ms per drafted token) of the step-time model."""
        fixed, per_token = self.cost.coefficients()
        draft = self.fixed_draft_ms if self.fixed_draft_ms is not None else self.draft_token_ms
        return fixed, per_token, draft

    def _cond(self, cand: Candidate, k: int) -> float:
        return self.stats.estimate(cand.source, cand.conf[k], k + 1)

    def candidates(self, context: list[int]) -> list[Candidate]:  # pragma: no cover - every subclass drafts
        raise NotImplementedError

    def propose(self, context: list[int]) -> Draft:
        cands = self.candidates(context)
        if not cands:
            return Draft()
        tree = merge_candidates(cands, self._cond)
        n = len(tree)
        if self.adaptive:
            fixed, per_token, _ = self.coefficients()  # drafting is spent: size by verification cost only
            n = best_size([tree.scores[i] for i in ranked_nodes(tree)], n, fixed, per_token)
        return select(tree, n)[0]
