"""Speculative decoding across the split: proposers, token trees and the verifier.

Public API: :class:`Draft`, :class:`Proposer` (subclass it and decorate with
``@register_proposer("name")``), :func:`make_proposer`, :func:`list_proposers`;
the verifier is :func:`splitinfer.decoding.verify.decode`, used by
``SplitModel.generate(..., decoding=NAME, decoding_options={...})``.
"""

from splitinfer.decoding.base import (
    Candidate,
    DecodingEnv,
    Draft,
    LocalModules,
    Proposer,
    StepFeedback,
    list_proposers,
    make_proposer,
    proposer_options,
    register_proposer,
)

__all__ = [
    "Candidate",
    "DecodingEnv",
    "Draft",
    "LocalModules",
    "Proposer",
    "StepFeedback",
    "list_proposers",
    "make_proposer",
    "proposer_options",
    "register_proposer",
]
