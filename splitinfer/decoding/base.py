"""Proposer interface, drafts and the proposer registry.

A *proposer* guesses what comes after the context; the verifier
(:mod:`splitinfer.decoding.verify`) checks the guesses against the model in
one round trip and keeps the longest correct prefix. Proposers never touch
the cloud body: they see token ids, plus (optionally) the verifier's
:class:`StepFeedback` (the model's greedy prediction at every draft node,
the step's timing and the hidden states it sent and received), which is how
Jacobi-style proposers get their next iterate. A proposer that declares
``needs_model`` may also run the client's *local* parts (``env.local``:
head and tail, with KV caches of its own), as ``local-draft`` does.

A :class:`Draft` is a token tree in parent-array form (see
:mod:`splitinfer.decoding.tree`): ``parents[i] == -1`` makes node ``i`` a
child of the context's last token. An empty draft means plain sequential
decoding.

Each proposer lives in its own module and registers itself by name with
``@register_proposer("name")``; :func:`make_proposer` builds one from a name
and keyword options and turns bad names or options into
:class:`~splitinfer.errors.SplitInferError`.
"""

from __future__ import annotations

import importlib
import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from splitinfer.decoding.tree import validate_parents
from splitinfer.errors import SplitInferError
from splitinfer.options import OptionTypeError, coerce_option
from splitinfer.timing import StepCostModel

if TYPE_CHECKING:
    import torch

# Modules imported by make_proposer / list_proposers so that their decorators run.
PROPOSER_MODULES = (
    "sequential", "jacobi", "ngram_pool", "lookahead", "prompt_lookup", "suffix", "local_draft", "feature_draft",
    "token_recycling", "rest", "suffix_automaton", "combined",
)


@dataclass(frozen=True)
class Draft:
    """A token tree to verify: ``tokens[i]`` hangs under ``parents[i]`` (-1 = the context's last token)."""

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))
        object.__setattr__(self, "parents", tuple(int(p) for p in self.parents))
        if len(self.tokens) != len(self.parents):
            raise SplitInferError(f"draft has {len(self.tokens)} tokens but {len(self.parents)} parents")
        validate_parents(list(self.parents))

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> Draft:
        """A single guessed continuation."""
        return cls(tuple(tokens), tuple(range(-1, len(tokens) - 1)))


EMPTY = Draft()


@dataclass(frozen=True)
class Candidate:
    """One guessed continuation from a source, for merging into a tree (see :mod:`.merge`).

    ``conf[k]`` is the source's own estimate (0..1] that ``tokens[k]`` is right
    given ``tokens[:k]`` are (a frequency ratio for the suffix cache, a rank
    discount for pools); ``rank`` orders a source's candidates, best first.
    """

    tokens: tuple[int, ...]
    conf: tuple[float, ...]
    source: str
    rank: int = 0


@dataclass(frozen=True)
class LocalModules:
    """The client's own model parts, lent by the verifier to proposers that draft with the model.

    ``head`` and ``tail`` are the :class:`~splitinfer.partition.LocalHead` /
    :class:`~splitinfer.partition.LocalTail` the verifier runs; a proposer
    may run them only with KV caches of its own (``head.new_cache()``), never
    the verifier's, and never reaches the cloud body.
    """

    head: object  # LocalHead: (1, T) ids -> (1, T, d)
    tail: object  # LocalTail: (1, T, d) -> (1, T, V) logits
    num_layers: int
    model_sha256: str = ""


@dataclass(frozen=True)
class SizingOptions:
    """The options of the proposers that size their trees by expected tokens per unit of step time.

    ``combined``, ``local-draft`` and ``feature-draft`` take them as keyword
    options (a constructor declares ``**sizing``; :func:`proposer_options`
    lists them): ``adaptive`` sizing on or off, the target link ``rtt_ms`` /
    ``bandwidth_mbps`` (None: the run's link), a fixed step cost ``step_ms`` and
    ``token_ms`` (both or neither; None: fitted online) and the ``decay`` of the
    online acceptance statistics.
    """

    adaptive: bool = True
    rtt_ms: float | None = None
    bandwidth_mbps: float | None = None
    step_ms: float | None = None
    token_ms: float | None = None
    decay: float = 0.98

    def __post_init__(self):
        for key in ("rtt_ms", "bandwidth_mbps", "step_ms", "token_ms"):  # None: the run's link, or fitted online
            value = getattr(self, key)
            if value is None:
                continue
            number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
            if not number or value < 0 or (key == "bandwidth_mbps" and value == 0):
                bound = "> 0" if key == "bandwidth_mbps" else ">= 0"
                raise SplitInferError(f"option {key}={value!r} must be a finite number {bound}, or left unset")
        if isinstance(self.decay, bool) or not isinstance(self.decay, (int, float)) or not 0 < self.decay <= 1:
            raise SplitInferError(f"option decay={self.decay!r} must be a number in (0, 1]")

    def link(self) -> dict[str, float | None]:
        """The step-cost options alone (what a sized proposer hands the sources it combines)."""
        return {"rtt_ms": self.rtt_ms, "bandwidth_mbps": self.bandwidth_mbps, "step_ms": self.step_ms,
                "token_ms": self.token_ms}

    def cost_model(self) -> StepCostModel:
        """A fresh step-cost model for these options."""
        return StepCostModel(**self.link())


@dataclass
class DecodingEnv:
    """What a proposer may know about the run (set by the verifier in :meth:`Proposer.begin`)."""

    vocab_size: int
    eos_ids: frozenset[int] = frozenset()
    max_new_tokens: int = 128
    rtt_ms: float = 0.0  # the link's emulated RTT (0 on an in-process link)
    bandwidth_mbps: float | None = None  # None = unlimited
    local: LocalModules | None = None  # the local head/tail (set by the verifier; None when replaying)
    tokenizer: object | None = None  # the model's tokenizer (datastore sources tokenise public text with it)


@dataclass
class StepFeedback:
    """What the verifier saw in one step, in the proposer's own draft indices.

    ``node_argmax[i]`` is the model's greedy next token after draft node ``i``
    (conditioned on ``i`` and its ancestors), or None where the verifier
    pruned the node. ``accepted_nodes`` are the draft nodes on the accepted
    path, root side first. ``root_argmax`` is the greedy token after the
    context's last token. ``sent_nodes`` are the draft nodes actually sent
    (the verifier prunes nodes that could only emit tokens past the budget).
    ``sent_states`` / ``received_states`` are the hidden states the step sent
    to the cloud body (head output) and got back (body output, as the tail
    saw it), one row per position sent: for a decode step row 0 is the
    context's last token and row ``1 + j`` is draft node ``sent_nodes[j]``;
    for the prefill, row ``i`` is prompt token ``i``. ``final_states`` are
    the tail's final normed states for the same rows (what the LM head saw;
    read by ``feature-draft``). None when replaying. ``topk_ids`` /
    ``topk_probs`` are the ``k`` most probable next tokens of every row sent
    and their softmax probabilities, when the proposer asks for them
    (:attr:`Proposer.feedback_topk`; read by ``token-recycling``); a row the
    step cannot know (a rejected node when replaying) has ids -1.
    """

    draft: Draft
    node_argmax: list[int | None]
    accepted_nodes: list[int]
    root_argmax: int
    timing: object | None = None  # the step's StepTiming
    sent_nodes: list[int] = field(default_factory=list)  # draft nodes the verifier kept and sent
    sent_states: torch.Tensor | None = None  # (T, d) head output of the positions sent
    received_states: torch.Tensor | None = None  # (T, d) body output for them
    final_states: torch.Tensor | None = None  # (T, d) the tail's final normed states for them
    topk_ids: torch.Tensor | None = None  # (T, k) long: the k most probable next tokens of each row sent
    topk_probs: torch.Tensor | None = None  # (T, k) fp32: their softmax probabilities

    def chooser_row(self, n_emitted: int) -> int:
        """Row of the states whose logits chose the last of the ``n_emitted`` (>= 1) tokens this step emitted.

        The last row for the prefill or a step without a draft; else the accepted path's node at that depth.
        """
        if not len(self.draft):
            return max(0, (0 if self.sent_states is None else int(self.sent_states.shape[0])) - 1)
        return self.committed_rows()[n_emitted - 1]

    def committed_rows(self) -> list[int]:
        """Rows of the states whose tokens are now committed context (fed to the caches for good).

        All rows for the prefill or a step without a draft; else the root and the accepted nodes.
        """
        if not len(self.draft):
            n = 0 if self.sent_states is None else int(self.sent_states.shape[0])
            return list(range(max(1, n)))
        row = {node: 1 + j for j, node in enumerate(self.sent_nodes)}
        return [0] + [row[i] for i in self.accepted_nodes]


class Proposer(ABC):
    """Guesses continuations; learns from what was accepted.

    Lifecycle per generation: ``begin(prompt, env)``, then per step
    ``propose(context)`` -> verify -> ``update(context, accepted, feedback)``,
    and finally ``end(prompt, output)``. ``context`` is the prompt plus all
    tokens emitted so far (its last token is the one the next step feeds the
    model); ``accepted`` are the tokens that step emitted (accepted draft
    tokens plus the model's bonus token).
    """

    name = "?"
    #: True when the proposer learns from the model's outputs at *rejected* draft nodes (Jacobi
    #: iterates, lookahead windows), so it cannot be replayed without the model.
    learns_from_rejected = False
    #: True when the proposer drafts by running the local model parts (``env.local``): it cannot be
    #: replayed without the model, and inside ``combined`` it is handed each step's feedback.
    needs_model = False
    #: True for a rule that also drafts from the prompt and has the draft verified in the prefill forward, as
    #: transformers' assisted generation does (``prompt-lookup`` with ``at_prefill``). Only :func:`replay`
    #: models it, to count a peer's forwards exactly; the split runtime's prefill carries no draft, so
    #: :func:`splitinfer.client.make_decoding` refuses such a proposer before a session opens.
    drafts_at_prefill = False
    #: How many top tokens (and probabilities) of every verified row's logits the proposer wants in its
    #: :class:`StepFeedback` (0 = none); the verifier computes them from logits it has anyway.
    feedback_topk = 0

    def begin(self, prompt: list[int], env: DecodingEnv) -> None:
        """Start a new generation for ``prompt`` (default: remember the env)."""
        self.env = env

    @property
    def eos_ids(self) -> frozenset[int]:
        """The run's EOS tokens (empty before :meth:`begin`)."""
        env = getattr(self, "env", None)
        return env.eos_ids if env is not None else frozenset()

    @abstractmethod
    def propose(self, context: list[int]) -> Draft:
        """Return a draft continuing ``context`` (empty = no guess this step)."""

    def update(self, context: list[int], accepted: list[int], feedback: StepFeedback | None = None) -> None:
        """Learn from one step: ``context + accepted`` is the new context."""

    def end(self, prompt: list[int], output: list[int]) -> None:
        """The generation finished with ``output`` (default: nothing)."""


_REGISTRY: dict[str, type[Proposer]] = {}


def register_proposer(name: str):
    """Class decorator: make a :class:`Proposer` subclass available as ``name``."""

    def deco(cls: type[Proposer]) -> type[Proposer]:
        if not (isinstance(cls, type) and issubclass(cls, Proposer)):
            raise SplitInferError(f"@register_proposer({name!r}) must decorate a Proposer subclass")
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise SplitInferError(f"proposer name {name!r} is already registered by {_REGISTRY[name].__name__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def _load_all() -> None:
    for mod in PROPOSER_MODULES:
        importlib.import_module(f"splitinfer.decoding.{mod}")


def registered_proposers() -> dict[str, type[Proposer]]:
    """The live registry, built-ins loaded: {name: class}."""
    _load_all()
    return _REGISTRY


def list_proposers() -> list[str]:
    """Names of all registered proposers, sorted."""
    _load_all()
    return sorted(_REGISTRY)


def proposer_options(name: str) -> dict[str, object]:
    """The keyword options ``name`` accepts, with their defaults."""
    params = inspect.signature(_proposer_class(name).__init__).parameters
    options = {k: p.default for k, p in params.items() if k != "self" and p.kind == p.KEYWORD_ONLY}
    if "sizing" in params and params["sizing"].kind == inspect.Parameter.VAR_KEYWORD:
        options.update((f.name, f.default) for f in fields(SizingOptions))
    return options


def _proposer_class(name: str) -> type[Proposer]:
    _load_all()
    if name not in _REGISTRY:
        raise SplitInferError(f"unknown decoding {name!r}; choose one of {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def make_proposer(name: str, **options) -> Proposer:
    """Build the proposer registered as ``name`` with keyword ``options``.

    Options that are None are dropped (so CLI flags left unset fall back to
    each proposer's defaults). Unknown options raise SplitInferError naming
    the ones the proposer takes.
    """
    return _proposer_class(name)(**typed_proposer_options(name, options))


def typed_proposer_options(name: str, options: dict) -> dict:
    """``options`` of proposer ``name`` without the None ones, each coerced to its default's type; a
    SplitInferError names an unknown option or a bad value. Builds nothing: ``bench validate`` checks a suite's
    ``decoding_options`` with it."""
    options = {k: v for k, v in options.items() if v is not None}
    accepted = proposer_options(name)
    bad = sorted(set(options) - set(accepted))
    if bad:
        takes = ", ".join(f"{k}={v!r}" for k, v in accepted.items()) or "no options"
        raise SplitInferError(f"decoding {name!r} does not take option(s) {', '.join(bad)}; it takes {takes}")
    for key, value in options.items():
        try:
            options[key] = coerce_option(value, accepted[key])
        except OptionTypeError as e:
            raise SplitInferError(f"decoding {name!r}: option {key}={value!r} must be {e.want}; "
                                  f"e.g. --decoding-option {key}={accepted[key]}") from None
    return options


def check_positive(name: str, value, minimum: int = 1) -> int:
    """Validate an integer option (shared by the proposers' constructors)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SplitInferError(f"option {name} must be an integer >= {minimum}, got {value!r}")
    return value
