"""Which code a job runs, from its own annotations: the shipped workdir's digest and, where it
was packed inside git, the commit and whether the tree was dirty (controller/render/workdir.py
writes them). Pure: the job in, a dict or a line out."""

from __future__ import annotations

from typing import Any

from controller.kubeflow import (
    ANNOTATION_WORKDIR_COMMIT,
    ANNOTATION_WORKDIR_DIGEST,
    ANNOTATION_WORKDIR_DIRTY,
)
from trainer.workdir import short


def workdir_of(job: dict[str, Any]) -> dict[str, Any] | None:
    """``{digest, commit, dirty}`` of the job's workdir (commit and dirty None outside git), or
    None for a job that ships none (its code is the image's)."""
    notes = job.get("metadata", {}).get("annotations") or {}
    digest = notes.get(ANNOTATION_WORKDIR_DIGEST)
    if not digest:
        return None
    dirty = notes.get(ANNOTATION_WORKDIR_DIRTY)
    return {
        "digest": digest,
        "commit": notes.get(ANNOTATION_WORKDIR_COMMIT),
        "dirty": None if dirty is None else dirty == "true",
    }


def code_line(workdir: dict[str, Any] | None) -> str:
    """``sha256:0123456789ab git 89abcdef0123 (dirty)``; ``image`` without a workdir."""
    if workdir is None:
        return "image"
    out = short(workdir["digest"])
    if workdir["commit"]:
        out += f" git {workdir['commit'][:12]}" + (" (dirty)" if workdir["dirty"] else "")
    return out
