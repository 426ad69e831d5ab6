"""The one exception type of the runtime package.

Every error a user can cause (bad split, unknown model spec, prompt too long,
malformed frame, ...) is raised as :class:`SplitInferError` with a message
that names the bad value and, where there is one, the fix.
"""


class SplitInferError(Exception):
    """A user-facing error of the split-inference runtime."""


class ProtocolError(SplitInferError):
    """A frame on the wire is malformed, oversized or violates the protocol."""
