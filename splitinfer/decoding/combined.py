"""``combined``: one de-duplicated token tree from several proposers, sized to pay for itself.

Candidates from the suffix cache (this request and earlier outputs), prompt
lookup (several recent matches), the seed's n-gram pool and Token Recycling
(the model's own earlier top-k tokens, :mod:`.token_recycling`), and on request
(``sources=...,local-draft`` / ``feature-draft``) the local model's own
drafts (:mod:`.local_draft`, :mod:`.feature_draft`; confidences = draft
probabilities) are merged into one trie (:mod:`splitinfer.decoding.merge`). Every node is scored by the
estimated probability that its whole path is accepted: the product of
per-token conditional acceptance rates *observed* for that kind of guess,
keyed by (source, the source's own confidence bucket, depth bucket), with the
source's confidence as a Beta prior and exponential forgetting. The tree
keeps the best nodes under the budget ``draft_budget`` (T, default 32) and,
with ``adaptive`` on, only as many as maximise expected tokens per unit of
step time under ``t(T) = fixed + per_token * T`` (:class:`OnlineStepCost`:
the compute measured from this run's steps, the network at ``rtt_ms`` /
``bandwidth_mbps``, by default the link's). When drafts keep failing the
observed rates, hence the scores, fall and the tree shrinks, down to no draft
at all; when they succeed it grows back.

A lookahead branch (Fu et al. 2024; ``window`` x ``ngram``, see
:mod:`.lookahead`) rides along when ``lookahead="on"``, or with ``"auto"``
when its nodes add at most 10% to the modelled step time (accelerator-like
costs, where extra positions are nearly free); its n-gram pool, learnt from
the model's own Jacobi iterates, is then one more candidate source.

This combination is our own design in the spirit of SpecInfer (Miao et al.
2024: merged token trees), Sequoia (Chen et al. 2024: trees sized by
expected acceptance under a hardware cost) and SuffixDecoding (Oliaro et al.
2024: adaptive speculation length). ``step_ms`` and ``token_ms`` fix the cost
model instead (reproducible runs); ``calibration`` is local-draft's bridge
calibration file, ``draft_head`` feature-draft's trained head and ``shortlist``
whether it drafts from the head's vocabulary shortlist.
"""

from __future__ import annotations

from splitinfer.decoding.base import (
    Candidate,
    Draft,
    Proposer,
    SizingOptions,
    StepFeedback,
    check_positive,
    make_proposer,
    register_proposer,
)
from splitinfer.decoding.lookahead import Lookahead
from splitinfer.decoding.merge import best_size, merge_candidates, ranked_nodes, select
from splitinfer.errors import SplitInferError

SOURCES = ("suffix", "prompt-lookup", "ngram-pool", "token-recycling", "rest", "suffix-automaton", "local-draft",
           "feature-draft")
# Training-free defaults (token-recycling: +0.14 tau over the other three, reports/decoding/report.txt);
# local-draft / feature-draft run the model: opt in.
DEFAULT_SOURCES = ("suffix", "prompt-lookup", "ngram-pool", "token-recycling")
_DEPTH_BUCKETS = (1, 2, 3, 5, 9)  # 1, 2, 3-4, 5-8, 9+


def _bucket(conf: float, depth: int) -> tuple[int, int]:
    d = sum(1 for b in _DEPTH_BUCKETS if depth >= b) - 1
    return min(4, int(conf * 5)), d


class AcceptanceStats:
    """Observed conditional acceptance per (source, confidence bucket, depth bucket), with forgetting."""

    def __init__(self, decay: float = 0.98, prior_strength: float = 2.0, cap: float = 0.98):
        self.decay, self.prior_strength, self.cap = decay, prior_strength, cap
        self.table: dict[tuple, list[float]] = {}  # key -> [accepted, trials]

    def key(self, source: str, conf: float, depth: int) -> tuple:
        return (source, *_bucket(conf, depth))

    def estimate(self, source: str, conf: float, depth: int) -> float:
        acc, n = self.table.get(self.key(source, conf, depth), (0.0, 0.0))
        return min(self.cap, (acc + self.prior_strength * conf) / (n + self.prior_strength))

    def observe(self, trials: list[tuple[tuple, bool]]) -> None:
        """``trials``: (key, accepted) for every guess whose parent was accepted this step."""
        for row in self.table.values():
            row[0] *= self.decay
            row[1] *= self.decay
        for key, ok in trials:
            row = self.table.setdefault(key, [0.0, 0.0])
            row[0] += 1.0 if ok else 0.0
            row[1] += 1.0


@register_proposer("combined")
class Combined(Proposer):
    """Merged, acceptance-ranked, cost-sized token trees from suffix, prompt-lookup, n-gram and lookahead sources."""

    def __init__(
        self,
        *,
        draft_budget: int = 32,
        sources: str = ",".join(DEFAULT_SOURCES),
        lookahead: str = "auto",
        window: int = 4,
        ngram: int = 4,
        pool: int = 4,
        calibration: str | None = None,
        draft_head: str | None = None,
        shortlist: bool = True,
        **sizing,  # SizingOptions
    ):
        self.budget = check_positive("draft_budget", draft_budget)
        names = [s.strip() for s in str(sources).split(",") if s.strip()]
        bad = [s for s in names if s not in SOURCES]
        if not names or bad:
            raise SplitInferError(f"combined sources must be a comma list from {', '.join(SOURCES)}; got {sources!r}")
        opts = SizingOptions(**sizing)
        self.adaptive, self.decay = bool(opts.adaptive), float(opts.decay)
        self.cost = opts.cost_model()
        sub_opts = {
            "suffix": {"draft_budget": self.budget, "alpha": 4.0, "min_prob": 0.02},
            "prompt-lookup": {"draft_budget": min(self.budget, 16), "candidates": 4},
            "ngram-pool": {"ngram": 5, "pool": 5},
            "token-recycling": {"draft_budget": self.budget},
            "rest": {"draft_budget": min(self.budget, 16)},
            "suffix-automaton": {"draft_budget": min(self.budget, 16)},
            "local-draft": {"draft_budget": min(self.budget, 8), **opts.link(), "calibration": calibration},
            "feature-draft": {"draft_budget": min(self.budget, 16), **opts.link(), "draft_head": draft_head,
                              "shortlist": shortlist},
        }
        self.sources = {name: make_proposer(name, **sub_opts[name]) for name in names}
        if lookahead not in ("auto", "on", "off"):
            raise SplitInferError(f"combined lookahead must be auto, on or off; got {lookahead!r}")
        self.lookahead_mode = lookahead
        self.lookahead = None if lookahead == "off" else Lookahead(window=window, ngram=ngram, pool=pool)
        self.branch_steps = 0  # steps that carried the lookahead branch (for reports)
        self.stats = AcceptanceStats(decay=self.decay)
        self._origins: list[list[tuple[str, int, int, float]]] = []
        self.sizes: list[int] = []  # draft size chosen per step (for reports)

    def begin(self, prompt, env) -> None:
        super().begin(prompt, env)
        for p in self._all():
            p.begin(prompt, env)
        self.cost.begin(env.rtt_ms, env.bandwidth_mbps)

    def candidates(self, context: list[int]) -> list[Candidate]:
        out: list[Candidate] = []
        for p in self._all():
            out += p.candidates(context)
        return out

    @property
    def learns_from_rejected(self) -> bool:  # only once the lookahead branch has ridden along
        return self.branch_steps > 0

    @property
    def feedback_topk(self) -> int:  # what token-recycling among the sources asks for
        return max((p.feedback_topk for p in self.sources.values()), default=0)

    @property
    def needs_model(self) -> bool:  # with local-draft or feature-draft among the sources
        return any(p.needs_model for p in self.sources.values())

    def _all(self) -> list[Proposer]:
        return [*self.sources.values(), *([self.lookahead] if self.lookahead else [])]

    def _use_branch(self, fixed: float, per_token: float) -> bool:
        """Carry the lookahead branch when on, or (auto) when its nodes add at most 10% to the step time."""
        if self.lookahead is None:
            return False
        nodes = self.lookahead.w * (self.lookahead.n - 1)
        return self.lookahead_mode == "on" or per_token * nodes <= 0.1 * fixed

    def _cond(self, cand: Candidate, k: int) -> float:
        conf = cand.conf[k] if k < len(cand.conf) else 1.0
        return self.stats.estimate(cand.source, conf, k + 1)

    def coefficients(self) -> tuple[float, float]:
        return self.cost.coefficients()

    def propose(self, context: list[int]) -> Draft:
        cands = self.candidates(context)
        tree = merge_candidates(cands, self._cond, max_nodes=4 * self.budget)
        order = ranked_nodes(tree)
        fixed, per_token = self.coefficients()
        if self.adaptive:
            n = best_size([tree.scores[i] for i in order], self.budget, fixed, per_token)
        else:
            n = min(self.budget, len(tree))
        draft, keep = select(tree, n)
        self._origins = [tree.origins[i] for i in keep]
        self.sizes.append(len(draft))
        if self._use_branch(fixed, per_token):
            tokens, parents = self.lookahead.branch(len(draft))
            self.branch_steps += 1
            return Draft(draft.tokens + tuple(tokens), draft.parents + tuple(parents))
        return draft

    def update(self, context, accepted, feedback: StepFeedback | None = None) -> None:
        for p in self.sources.values():  # the feedback's node indices are ours; model drafters read its states,
            wants = p.needs_model or p.feedback_topk > 0  # token-recycling its rows' top tokens (by sent_nodes)
            p.update(context, accepted, feedback if wants else None)
        if self.lookahead is not None:
            self.lookahead.update(context, accepted, feedback)  # reads its branch's outputs, if it rode along
        if feedback is None:
            return
        self.cost.observe(feedback.timing)
        draft, ok, sent = feedback.draft, set(feedback.accepted_nodes), set(feedback.sent_nodes)
        trials: list[tuple[tuple, bool]] = []
        for i, origins in enumerate(self._origins):
            if i not in sent:  # pruned by the verifier: never tried
                continue
            parent = draft.parents[i]
            if parent >= 0 and parent not in ok:
                continue
            keys = {self.stats.key(source, conf, depth) for source, _rank, depth, conf in origins}
            trials += [(key, i in ok) for key in keys]
        self.stats.observe(trials)
        self._origins = []

    def end(self, prompt, output) -> None:
        for p in self._all():
            p.end(prompt, output)
