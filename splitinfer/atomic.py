"""Writing artefacts so that a crash never leaves a file a later command trusts while it is corrupt.

Every writer of a cache, checkpoint, head or results file goes through here:

- :func:`atomic_file` yields a temporary path *in the target's directory*; the
  caller writes it (with any library: ``save_file``, ``save_pretrained`` ...);
  on success the file is fsynced and renamed over the target with
  :func:`os.replace` (atomic on POSIX), then the directory is fsynced. On any
  error, or a ``kill -9`` half-way, the target is untouched and only a
  ``.NAME.*.tmp`` file may remain, which nothing reads.
- :func:`write_text` / :func:`write_json` do that for text.
- :func:`atomic_dir` builds a whole directory under a temporary name, writes a
  completion marker **last**, and renames it into place; :func:`is_complete`
  is what readers check (a directory without the marker is a leftover of an
  interrupted write: rebuild it).
- :func:`guard_overwrite` refuses to overwrite an artefact of a *different*
  run (another identity) unless ``force``: training checkpoints and draft heads;
  :func:`check_made_for` is the reader's side: an artefact's JSON description
  must have the expected format, version and identity.

The rename step is :func:`_commit`; tests replace it to inject a failure
between the write and the rename.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from splitinfer.errors import SplitInferError

MARKER = ".complete"


def _fsync_path(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    if path.is_dir():
        for p in sorted(path.rglob("*")):
            if p.is_file():
                _fsync_path(p)
    _fsync_path(path)


def _commit(tmp: Path, target: Path) -> None:
    """Flush ``tmp`` to disk and rename it over ``target`` (the step a crash cannot tear)."""
    _fsync_tree(tmp)
    os.replace(tmp, target)
    _fsync_path(target.parent)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=_temp_prefix(path.name), suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        _commit(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike[str], obj: Any, **dumps_kwargs: Any) -> Path:
    """``json.dumps(obj, **dumps_kwargs)`` written atomically to ``path``."""
    return write_text(path, json.dumps(obj, **dumps_kwargs))


def is_complete(directory: str | os.PathLike[str]) -> bool:
    """True when ``directory`` was finished by :func:`atomic_dir` (its marker exists)."""
    return (Path(directory) / MARKER).is_file()


def mark_complete(directory: str | os.PathLike[str], info: dict | None = None) -> None:
    """Write the completion marker of ``directory`` (last, after everything else is on disk)."""
    directory = Path(directory)
    _fsync_tree(directory)
    write_json(directory / MARKER, info or {})


def _temp_prefix(name: str) -> str:
    return f".{name}.{os.getpid()}."  # the writer's pid: remove_leftovers spares live writers' files


@contextlib.contextmanager
def atomic_dir(directory: str | os.PathLike[str], info: dict | None = None) -> Iterator[Path]:
    """Yield an empty temporary directory; on success mark it complete and move it to ``directory``.

    An existing ``directory`` without a marker (an interrupted earlier write) is
    replaced; one that another process completed meanwhile is kept (ours is dropped).
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(directory.name), suffix=".tmp", dir=directory.parent))
    try:
        yield tmp
        mark_complete(tmp, info)
        if is_complete(directory):
            return
        if directory.exists():
            old = Path(tempfile.mkdtemp(prefix=_temp_prefix(directory.name), suffix=".old", dir=directory.parent))
            os.replace(directory, old / "x")
            shutil.rmtree(old, ignore_errors=True)
        _commit(tmp, directory)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _abandoned(p: Path, name: str) -> bool:
    """True for a leftover whose writer is gone (dead pid in its name; other names: older than 10 minutes)."""
    pid = p.name[len(name) + 2 :].split(".", 1)[0] if p.name.startswith(f".{name}.") else ""
    if pid.isdigit():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except OSError:  # alive, owned by someone else
            pass
        return False
    try:
        return time.time() - p.stat().st_mtime > 600
    except OSError:
        return False


def remove_leftovers(directory: str | os.PathLike[str], name: str) -> int:
    """Delete leftovers of interrupted writes of ``name`` in ``directory``; return how many.

    Those are ``.NAME.PID.*.tmp`` / ``.old`` of writers no longer running, and ``NAME.tmp`` (the
    fixed name used before this module) once it is ten minutes old.
    """
    n = 0
    for p in [*Path(directory).glob(f".{name}.*"), Path(directory) / f"{name}.tmp"]:
        if p.exists() and p.suffix in (".tmp", ".old") and _abandoned(p, name):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            n += 1
    return n


def guard_overwrite(existing_config: str | os.PathLike[str], identity: dict, key: str, force: bool,
                    what: str, error: type[Exception] = SplitInferError) -> None:
    """Refuse to overwrite an artefact whose JSON ``existing_config`` records another ``identity``.

    ``identity`` is stored by the writer under ``key``; an artefact without it
    (written by an older version, or unreadable) also counts as another run.
    ``force`` skips the check.
    """
    path = Path(existing_config)
    if force or not path.exists():
        return
    try:
        old = json.loads(path.read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        old = None
    if old != identity:
        raise error(f"{path.parent} already holds {what} of a different run; pass --force to overwrite it, "
                    "or choose another output directory")


def check_made_for(info: Any, path: str | os.PathLike[str], fmt: str, version: int, expect: dict | None,
                   what: str, fix: str) -> dict:
    """``info`` (the JSON description at ``path``) checked: ``format`` ``fmt`` at ``version``, and each
    ``expect`` entry that is not None or empty equal to ``info``'s (else one-line SplitInferError ending in ``fix``)."""
    if not isinstance(info, dict) or info.get("format") != fmt or info.get("version") != version:
        raise SplitInferError(f"{path} is not a {fmt} v{version} file")
    for key, want in (expect or {}).items():
        if want not in (None, "") and info.get(key) != want:
            raise SplitInferError(f"{what} {path} was made for {key}={info.get(key)!r}, not {want!r}; {fix}")
    return info


def safetensors_intact(path: str | os.PathLike[str]) -> str | None:
    """None when ``path`` is a complete safetensors file, else what is wrong (checks sizes, reads no tensor)."""
    import struct

    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path.name} is truncated ({size} bytes)"
            (hlen,) = struct.unpack("<Q", head)
            if hlen > min(size, 100 * 2**20):
                return f"{path.name} has an implausible header length {hlen}"
            header = json.loads(f.read(hlen))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        return f"{path.name} is unreadable ({type(e).__name__})"
    if not isinstance(header, dict):
        return f"{path.name} has a bad header"
    ends = [v["data_offsets"][1] for k, v in header.items()
            if k != "__metadata__" and isinstance(v, dict) and isinstance(v.get("data_offsets"), list)]
    want = 8 + hlen + max(ends, default=0)
    if size != want:
        return f"{path.name} is {size} bytes, its header needs {want} (truncated or corrupt)"
    return None
