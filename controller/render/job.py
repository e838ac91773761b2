"""The job a spec renders to, by its ``api:``: a PyTorchJob or a TrainJob."""

from __future__ import annotations

from typing import Any

from controller.render.monitoring import monitoring_objects
from controller.render.pytorchjob import render_pytorchjob
from controller.render.trainjob import render_trainjob
from controller.spec import JobSpec

RENDERERS = {"pytorchjob": render_pytorchjob, "trainjob": render_trainjob}


def render_job(spec: JobSpec) -> dict[str, Any]:
    """The job ``submit`` creates and ``render`` prints for ``spec``."""
    return RENDERERS[spec.api](spec)


def render_objects(spec: JobSpec) -> list[dict[str, Any]]:
    """Everything ``render`` prints and ``submit`` creates for ``spec``, in order: the job, then
    what its ``monitoring`` asks for (a PodMonitor, the Grafana dashboard's ConfigMap)."""
    return [render_job(spec), *monitoring_objects(spec)]
