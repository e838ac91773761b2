"""Where builds keep what they made (``~/.cache/ddpjob``), the locks that serialise them between
processes, and the short digests that key them."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/ddpjob`` (default ``~/.cache/ddpjob``): builds, locks, kept logs."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ddpjob"


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created, folders too) for the block: one
    process at a time across make, pytest sessions and checkouts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def short_digest(*parts: bytes | str) -> str:
    """A short hash of ``parts`` (length-prefixed, so ("ab", "c") != ("a", "bc")): cache keys."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()[:16]
