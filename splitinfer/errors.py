"""The one exception type of the runtime package.

Every error a user can cause (bad split, unknown model spec, prompt too long,
malformed frame, ...) is raised as :class:`SplitInferError` with a message
that names the bad value and, where there is one, the fix.
"""


class SplitInferError(Exception):
    """A user-facing error of the split-inference runtime."""


class ProtocolError(SplitInferError):
    """A frame on the wire is malformed, oversized or violates the protocol."""


class ComponentError(SplitInferError):
    """A component (attack, defense, proposer, corpus; built-in or plugin) returned output the harness cannot use:
    a wrong shape or non-finite values. The harness drops that component from the run and records it as failed."""
