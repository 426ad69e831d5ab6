"""The one exception type of the attacks package.

Every error a user can cause in the attacks package (unknown corpus, unreadable
file, malformed JSONL line, empty split, bad split name, ...) is raised as
:class:`AttackError` with a message that names the bad value and, where there
is one, the fix.
"""


class AttackError(Exception):
    """A user-facing error of the inversion-attack package."""
