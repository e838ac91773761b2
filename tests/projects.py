"""A user's project folder for the workdir tests: files written, and a git repository made of
them, as a user's checkout is (controller/workdir.py packs by git's rules inside one)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def write_tree(root: Path, files: dict[str, str | bytes]) -> Path:
    """``files`` (relative path -> text or bytes) under ``root``; ``root``."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def git(root: Path, *args: str) -> str:
    """``git ARGS`` in ``root`` with a committer set; its stdout."""
    return subprocess.run(
        ["git", "-c", "user.name=ddpjob-tests", "-c", "user.email=tests@ddpjob.local", *args],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def git_repository(root: Path, files: dict[str, str | bytes]) -> Path:
    """``files`` under ``root``, every one committed in a new repository; ``root``."""
    write_tree(root, files)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "project")
    return root
