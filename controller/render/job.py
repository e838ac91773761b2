"""The job a spec renders to, by its ``api:``: a PyTorchJob or a TrainJob; and what goes with it."""

from __future__ import annotations

from typing import Any

from controller.render.monitoring import monitoring_objects
from controller.render.pytorchjob import render_pytorchjob
from controller.render.trainjob import render_trainjob
from controller.render.workdir import with_workdir
from controller.spec import JobSpec
from controller.workdir import Shipped

RENDERERS = {"pytorchjob": render_pytorchjob, "trainjob": render_trainjob}


def render_job(spec: JobSpec, shipped: Shipped | None = None) -> dict[str, Any]:
    """The job ``submit`` creates and ``render`` prints for ``spec``; with a ``workdir``,
    ``shipped`` names its packed archive (the CLI packs; render never reads the folder)."""
    if spec.workdir and shipped is None:
        raise ValueError("render_job: a spec with a workdir needs what was packed (shipped)")
    job = RENDERERS[spec.api](spec)
    return with_workdir(job, spec, shipped) if shipped is not None else job


def render_objects(spec: JobSpec, shipped: Shipped | None = None) -> list[dict[str, Any]]:
    """Everything ``render`` prints and ``submit`` creates for ``spec``, in order: the job, then
    what its ``monitoring`` asks for (a PodMonitor, the Grafana dashboard's ConfigMap). A
    workdir's ConfigMap is the CLI's to make (it holds the archive, which render never reads)."""
    return [render_job(spec, shipped), *monitoring_objects(spec)]
