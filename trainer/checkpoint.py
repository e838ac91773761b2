"""Checkpoints that survive preemption: atomic writes, keep-last-k, resume past a torn file.

Rank 0 writes ``step_00000100.pt`` as a temp file in the same directory, fsyncs it and
``os.replace``s it into place, so a reader sees either the old set of files or the new one,
never half a file. Every rank then waits at a barrier, so no rank can go on (and, after a
crash, no rerun can read) before the file is complete. Loading tries the newest file first and
falls back to older ones when a file is unreadable (e.g. written by a tool without these
guarantees, or damaged on disk).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import torch

from trainer import distributed as distributed_

log = logging.getLogger(__name__)

_NAME = re.compile(r"step_(\d+)\.pt")


class CheckpointManager:
    """Save and find checkpoints in one directory (a PVC on a cluster, shared by all ranks)."""

    def __init__(self, directory: str | os.PathLike, keep: int, is_main: bool):
        self.dir = Path(directory)
        self.keep = keep
        self.is_main = is_main
        if is_main:
            self.dir.mkdir(parents=True, exist_ok=True)
            # A writer killed mid-save leaves only its temp file behind; it is never read.
            for stale in self.dir.glob(".step_*.pt.tmp-*"):
                stale.unlink(missing_ok=True)
        distributed_.barrier()  # the directory exists before any rank looks at it

    def path_for(self, step: int) -> Path:
        return self.dir / f"step_{step:08d}.pt"

    def list(self) -> list[Path]:
        """Checkpoint files, newest step first."""
        found = [
            (int(m.group(1)), p)
            for p in self.dir.glob("step_*.pt")
            if (m := _NAME.fullmatch(p.name))
        ]
        return [p for _, p in sorted(found, reverse=True)]

    def save(self, state: dict[str, Any] | None, step: int) -> Path:
        """Rank 0 writes ``state`` atomically and prunes old files; every rank waits for it."""
        path = self.path_for(step)
        if self.is_main:
            assert state is not None, "rank 0 must pass the state to save"
            tmp = self.dir / f".{path.name}.tmp-{os.getpid()}"
            with open(tmp, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _fsync_dir(self.dir)  # make the rename itself durable
            for old in self.list()[self.keep :]:
                old.unlink(missing_ok=True)
        distributed_.barrier()
        return path

    def resolve(self, resume: str) -> tuple[Path | None, list[str]]:
        """Rank 0: the checkpoint to resume from (or None) and notes on files skipped.

        ``never`` -> None; ``auto`` -> newest readable file in the directory, if any;
        anything else is a path that must load.
        """
        if resume == "never":
            return None, []
        if resume != "auto":
            path = Path(resume)
            read(path)  # let a bad explicit path fail loudly
            return path, []
        skipped = []
        for path in self.list():
            try:
                read(path)
            except Exception as e:  # torn zip, truncated pickle, I/O error: all mean "skip it"
                note = f"{path}: unreadable ({_first_line(e)})"
                log.warning("checkpoint %s; trying an older one", note)
                skipped.append(note)
                continue
            return path, skipped
        return None, skipped

    def load(self, resume: str) -> tuple[dict[str, Any] | None, Path | None, list[str]]:
        """On every rank: the state chosen by rank 0 (path broadcast, each rank reads it)."""
        choice = self.resolve(resume) if self.is_main else (None, [])
        path, skipped = distributed_.broadcast_object(
            (str(choice[0]) if choice[0] else None, choice[1])
        )
        if path is None:
            return None, None, skipped
        return read(Path(path)), Path(path), skipped


def read(path: Path) -> dict[str, Any]:
    """Load a checkpoint onto CPU; raise if it is not a complete one of ours."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "model" not in state or "step" not in state:
        raise ValueError("not a ddpjob checkpoint (no model/step)")
    return state


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"
