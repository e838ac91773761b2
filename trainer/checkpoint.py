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
from trainer.config import ConfigError

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

    def resolve(self, resume: str) -> tuple[Path | None, dict[str, Any] | None, list[str]]:
        """Rank 0: the checkpoint to resume from, its state, and notes on files skipped.

        ``never`` -> nothing; ``auto`` -> the newest readable file in the directory, if any;
        anything else is a path that must load.
        """
        if resume == "never":
            return None, None, []
        if resume != "auto":
            path = Path(resume)
            try:
                return path, read(path), []
            except Exception as e:  # the user named this file: say so, do not fall back
                raise ConfigError([f"resume: cannot load {_first_line(e)} (got {resume})"]) from e
        skipped = []
        for path in self.list():
            try:
                return path, read(path), skipped
            except Exception as e:  # torn zip, truncated pickle, I/O error: all mean "skip it"
                note = f"{path}: unreadable ({_first_line(e)})"
                log.warning("checkpoint %s; trying an older one", note)
                skipped.append(note)
        return None, None, skipped

    def load(self, resume: str) -> tuple[dict[str, Any] | None, Path | None, list[str]]:
        """On every rank: the state rank 0 chose (its path is broadcast; the others read it)."""
        path, state, skipped, problem = None, None, [], None
        if self.is_main:
            try:
                path, state, skipped = self.resolve(resume)
            except ConfigError as e:
                problem = e.problems  # every rank must learn it, or the others would hang
        path_str, skipped, problem = distributed_.broadcast_object(
            (str(path) if path else None, skipped, problem)
        )
        if problem:
            raise ConfigError(problem)
        if path_str is None:
            return None, None, skipped
        if state is None:  # not rank 0: read the file rank 0 validated
            state = read(Path(path_str))
        return state, Path(path_str), skipped


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


def _first_line(e: BaseException, limit: int = 120) -> str:
    text = str(e).strip().splitlines()
    line = f"{type(e).__name__}: {text[0] if text else ''}"
    return line if len(line) <= limit else line[: limit - 3] + "..."
