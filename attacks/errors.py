"""The one exception type of the attacks package.

Every error a user can cause in the attacks package (unknown corpus, unreadable
file, malformed JSONL line, empty split, bad split name, ...) is raised as
:class:`AttackError` with a message that names the bad value and, where there
is one, the fix.
"""


class AttackError(Exception):
    """A user-facing error of the inversion-attack package."""


from splitinfer.errors import ComponentError  # noqa: E402  (after the docstring'd base: a leaf import)


class AttackOutputError(AttackError, ComponentError):
    """An attack returned output of the wrong shape or with non-finite values: the harness drops it from the run
    (both an :class:`AttackError` and a :class:`splitinfer.errors.ComponentError`)."""
