"""Turn a JobSpec into values for the Helm chart (charts/ddpjob): ``render SPEC --values``.

Pure, like the renderers beside it: spec in, plain dict out. Fed to the chart, these values give
exactly the job ``render_job(spec)`` gives, PyTorchJob or TrainJob (a test holds ``helm template``
equal to ``render`` for every example); only the chart's ``managed-by: Helm`` and
``helm.sh/chart`` labels differ.

The values mirror the spec: same keys, same nesting, snake_case, so a reader moves between a
spec and a values file without a dictionary. Where the chart could not reproduce the renderer
exactly, the value is the renderer's own output instead of the spec's input:

- ``args`` replaces ``trainer``: the trainer settings already encoded as the sorted
  ``key=value`` strings the container receives (``render.args.trainer_args``). Go templates cannot
  re-create that quoting and float formatting, and the settings were validated here anyway.
  ``metrics_port`` is the one trainer setting the pods' metadata needs (their prometheus.io
  annotations, the PodMonitor): the port the trainer serves its metrics on, 0 when it serves
  none (not null: Helm takes a null value for "remove the chart's default").
- ``env`` and ``secret_env`` are lists, not maps: Helm walks maps in sorted key order, and
  environment order matters (``$(VAR)`` references expand only from earlier entries).
- ``workdir`` is not the folder (the chart cannot read it) but what was packed: its digest,
  where the pods fetch it (``config_map`` or ``url``, the latter folding in ``workdir_store``),
  the git commit and dirty flag, and for the ConfigMap the archive itself, base64, which the
  chart puts into a ConfigMap of its own (a Helm release keeps it, so the limit is lower).
- Optional settings that are unset are written out as ``""`` (names) or ``null`` (numbers and
  sections), never left out, so a chart default can't leak into a rendered job.

``values_schema.py`` reshapes the spec's JSON Schema by the same rules into the chart's
values.schema.json: change both or neither.
"""

from __future__ import annotations

import base64
from typing import Any

from controller.kubeflow import DEFAULT_COMMAND
from controller.render.args import trainer_args
from controller.render.pod import metrics_port
from controller.spec import JobSpec
from controller.workdir import Shipped


def render_values(
    spec: JobSpec, shipped: Shipped | None = None, archive: bytes | None = None
) -> dict[str, Any]:
    """Chart values for ``spec``: ``helm template -f`` of them gives ``render_job(spec,
    shipped)`` (and, with ``archive``, the ConfigMap that holds it)."""
    return {
        "name": spec.name,
        "namespace": spec.namespace,
        "api": spec.api,
        "runtime": spec.runtime,
        "image": spec.image,
        "command": list(spec.command or DEFAULT_COMMAND),
        "args": list(spec.args) if spec.args is not None else trainer_args(spec.trainer),
        "nodes": spec.nodes,
        "nproc_per_node": spec.nproc_per_node,
        "resources": spec.resources.model_dump(),
        "shm_size": spec.shm_size,
        "env": [{"name": k, "value": v} for k, v in spec.env.items()],
        "secret_env": [
            {"name": k, "secret": ref.secret, "key": ref.key} for k, ref in spec.secret_env.items()
        ],
        "volumes": [v.model_dump(exclude_none=True) for v in spec.volumes],
        "grace_period_s": spec.grace_period_s,
        "node_selector": dict(spec.node_selector),
        "tolerations": [t.model_dump(exclude_none=True) for t in spec.tolerations],
        "priority_class": spec.priority_class or "",
        "service_account": spec.service_account or "",
        "image_pull_secrets": list(spec.image_pull_secrets),
        "labels": dict(spec.labels),
        "annotations": dict(spec.annotations),
        "queue": spec.queue or "",
        "gang": spec.gang.model_dump(exclude_none=True) if spec.gang else None,
        "elastic": spec.elastic.model_dump() if spec.elastic else None,
        "restart_policy": spec.restart_policy,
        "backoff_limit": spec.backoff_limit,
        "active_deadline_s": spec.active_deadline_s,
        "ttl_after_finished_s": spec.ttl_after_finished_s,
        "clean_pod_policy": spec.clean_pod_policy or "",
        "suspend": spec.suspend,
        "metrics_port": metrics_port(spec) or 0,
        "monitoring": spec.monitoring.model_dump(),
        "workdir": workdir_values(shipped, archive),
    }


def workdir_values(shipped: Shipped | None, archive: bytes | None) -> dict[str, Any] | None:
    """What the chart needs of a shipped workdir: what render names, and the archive itself
    (base64) where the chart creates the ConfigMap."""
    if shipped is None:
        return None
    return {
        "digest": shipped.digest,
        "config_map": shipped.config_map or "",
        "url": shipped.url or "",
        "git_commit": shipped.commit or "",
        "git_dirty": "" if shipped.dirty is None else ("true" if shipped.dirty else "false"),
        "archive": base64.b64encode(archive).decode() if archive is not None else "",
    }
