"""The checkout a result was made from: its commit, whether it was dirty, and a digest of its code.

Results documents record ``git_hash`` / ``git_dirty`` (:func:`git_state`) and ``code_digest``
(:func:`code_digest`, which lets shards of one run come from commits that differ outside the code). A command
that writes its outputs into the tree (plots, partial files under ``reports/``) would find the checkout dirty
by its own files when it makes its document at the end, so the CLI takes the state when a command starts
(:func:`remember_git_state`) and :func:`git_state` returns that one until the command ends
(:func:`forget_git_state`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
from pathlib import Path

logger = logging.getLogger(__name__)

_REPO_DIR = Path(__file__).resolve().parent.parent
CODE_PACKAGES = ("splitinfer", "attacks", "benchmarks")  # the code a result depends on (code_digest)
_AT_START: dict[Path, tuple[str, bool | None]] = {}  # checkout -> its state when the running command began


def _repo(repo_dir: str | os.PathLike[str] | None) -> Path:
    return (Path(repo_dir) if repo_dir is not None else _REPO_DIR).resolve()


def _git(repo_dir: Path, *args: str) -> str | None:
    """stdout of a git command in ``repo_dir``, or None if it fails."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(repo_dir), *args], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        logger.debug("git %s failed: %s", " ".join(args), exc)
        return None
    return proc.stdout if proc.returncode == 0 else None


def _read_git_state(repo: Path) -> tuple[str, bool | None]:
    head = _git(repo, "rev-parse", "HEAD")
    status = _git(repo, "status", "--porcelain")
    return (head.strip() if head else "unknown"), (None if status is None else bool(status.strip()))


def git_state(repo_dir: str | os.PathLike[str] | None = None) -> tuple[str, bool | None]:
    """``(HEAD commit or "unknown", dirty flag or None)`` of the checkout at ``repo_dir``: as the running command
    found it when one has called :func:`remember_git_state`, else as it is now.

    Dirty means ``git status --porcelain`` lists anything (modified, staged
    or untracked-but-not-ignored files).
    """
    repo = _repo(repo_dir)
    return _AT_START.get(repo) or _read_git_state(repo)


def remember_git_state(repo_dir: str | os.PathLike[str] | None = None) -> None:
    """Take the checkout's state now, at a command's start: results documents made later by the same command
    record it, not the state after the run has written its own outputs (plots, partial files) into the tree.

    A run writing into a clean checkout's ``reports/`` was recorded dirty by the files it had just made."""
    repo = _repo(repo_dir)
    _AT_START[repo] = _read_git_state(repo)


def forget_git_state() -> None:
    """Back to reading the checkout's state live (a command has ended)."""
    _AT_START.clear()


def code_digest(repo_dir: str | os.PathLike[str] | None = None) -> str:
    """sha256 over every ``.py`` file of :data:`CODE_PACKAGES` (relative path and bytes, in path order).

    Two commits that differ only in reports, docs, tests or suite files have the same digest, so shards run from
    either are shards of one run (``bench merge``); any change to the code changes it.
    """
    root = Path(repo_dir) if repo_dir is not None else _REPO_DIR
    h = hashlib.sha256()
    for f in sorted(p for pkg in CODE_PACKAGES for p in (root / pkg).rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()
