"""The job a spec renders to, by its ``api:``: a PyTorchJob or a TrainJob."""

from __future__ import annotations

from typing import Any

from controller.render.pytorchjob import render_pytorchjob
from controller.render.trainjob import render_trainjob
from controller.spec import JobSpec

RENDERERS = {"pytorchjob": render_pytorchjob, "trainjob": render_trainjob}


def render_job(spec: JobSpec) -> dict[str, Any]:
    """The manifest ``submit`` creates and ``render`` prints for ``spec``."""
    return RENDERERS[spec.api](spec)
