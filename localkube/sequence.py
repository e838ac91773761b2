"""The whole cluster in start order: every room's components and steps, and the checks and resets
around them.

``up`` walks :data:`SEQUENCE` in order: a component with ``wait="now"`` is waited for before the
next one starts (etcd before the API server), the others start at once and are waited for
together at the end. A step is work between processes (the kwok nodes need the API server, the
torch runtime Trainer's webhook). ``down`` stops the processes in reverse.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .addons import kueue, mlflow, prometheus, s3, trainer_v2, training_operator
from .controlplane import bootstrap
from .controlplane import components as control_plane
from .controlplane.context import Component, Context, Step
from .node import containerd, coredns, host, images, kubelet

#: The real node, after the control plane (it registers with the API server).
NODE: tuple[Component | Step, ...] = (
    containerd.CONTAINERD,
    Step("node-images", images.import_images),
    Step("node-objects", kubelet.apply_objects),
    kubelet.KUBELET,
    coredns.COREDNS,
)


def _kueue_queues(ctx: Context) -> None:
    kueue.install_queues(ctx, kubelet.NODE_NAME if host.ENABLED else None)


#: Start order; ``down()`` stops the processes in reverse.
SEQUENCE: tuple[Component | Step, ...] = (
    control_plane.ETCD,
    control_plane.APISERVER,
    control_plane.CONTROLLER_MANAGER,
    control_plane.SCHEDULER,
    Step("bootstrap-objects", bootstrap.apply),
    control_plane.KWOK,
    Step("training-operator-objects", training_operator.apply_objects),
    training_operator.TRAINING_OPERATOR,
    Step("trainer-v2-objects", trainer_v2.apply_objects),
    trainer_v2.JOBSET_CONTROLLER,
    trainer_v2.TRAINER_CONTROLLER,
    Step("torch-distributed-runtime", trainer_v2.install_torch_runtime),
    # Kueue after the operators (its integrations need their CRDs, the TrainJob one the runtime).
    *((Step("kueue-objects", kueue.apply_objects), kueue.KUEUE) if kueue.ENABLED else ()),
    *(NODE if host.ENABLED else ()),
    # The S3 server, MLflow and Prometheus listen on the node's bridge, which containerd's
    # preparation creates. MLflow first: its imports take longest, and the rest start meanwhile.
    *((Step("mlflow-objects", mlflow.apply_objects), mlflow.MLFLOW) if mlflow.ENABLED else ()),
    *((Step("s3-objects", s3.apply_objects), s3.S3) if s3.ENABLED else ()),
    *(
        (Step("prometheus-objects", prometheus.apply_objects), prometheus.PROMETHEUS)
        if prometheus.ENABLED
        else ()
    ),
    # The quick start's queues: the ClusterQueue's quota is the real node's CPU and memory.
    *((Step("kueue-queues", _kueue_queues),) if kueue.ENABLED else ()),
)

#: Checks before anything is built or started: each raises a one-line LocalkubeError when this
#: machine cannot run the cluster.
HOST_CHECKS: tuple[Callable[[Path], None], ...] = (
    kubelet.preflight,
    s3.preflight,
    mlflow.preflight,
    prometheus.preflight,
)
#: Undo what the cluster changed on the machine outside its processes and state folder; run by
#: ``down`` after the processes stop and by ``up`` before it starts (what a killed run left).
HOST_RESETS: tuple[Callable[[Path, Callable[[str], None]], None], ...] = (kubelet.reset,)


def _default_service_account(ctx: Context) -> bool:
    proc = ctx.kubectl("get", "serviceaccount", "default", "-n", "default", check=False)
    return proc.returncode == 0


#: Cluster-wide conditions checked after every component is ready: (what, probe).
FINAL_PROBES: tuple[tuple[str, Callable[[Context], bool]], ...] = (
    ("default service account", _default_service_account),
)


def components() -> list[Component]:
    """The processes of the cluster, in start order."""
    return [c for c in SEQUENCE if isinstance(c, Component)]


def port_names() -> list[str]:
    """Every port a component listens on (each gets a free port at ``up``, below the kernel's
    ephemeral range: ``procs.free_ports``)."""
    return [p for c in components() for p in c.ports]
