"""PersistentVolumes of the real node: a folder of this machine as a ``local`` volume.

Checkpoints that must outlive a pod (the training operator re-creates a failed pod with a new
UID, and an emptyDir goes with the old one) live on a PersistentVolume, as on a real cluster.
Here that is a ``local`` volume: the folder ``/var/lib/ddpjob/volumes/<namespace>-<claim>`` with
a nodeAffinity to the real node, bound ahead of time to a claim of that name, so the scheduler
places every pod that mounts it on the node that has it. ``local`` volumes honour the pod's
``fsGroup``: the kubelet hands the folder to group 1000, so the trainer (uid 1000) writes there.

Pure manifests here; ``handle.Cluster.local_volume`` creates them (and the folder), and
``handle.temporary_namespace`` deletes them with the namespace. ``down`` removes every folder
(``host.reset``): the objects go with etcd.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import host

#: The folders of the volumes, one per (namespace, claim).
VOLUMES_DIR = host.VOLUMES_DIR
STORAGE_CLASS = "ddpjob-local"
#: On each PersistentVolume (cluster-scoped): the namespace whose claim it belongs to.
LABEL_NAMESPACE = "ddpjob.local/volume-namespace"


def host_path(namespace: str, claim: str) -> Path:
    """The folder on this machine that holds the volume of ``claim`` in ``namespace``."""
    return VOLUMES_DIR / f"{namespace}-{claim}"


def volume_name(namespace: str, claim: str) -> str:
    return f"ddpjob-{namespace}-{claim}"


def storage_class() -> dict[str, Any]:
    """No provisioner: every volume is made ahead of time by :func:`persistent_volume`.
    WaitForFirstConsumer is what local volumes want (the pod's node decides); a claim bound
    ahead of time is bound at once all the same."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Retain",
    }


def persistent_volume(namespace: str, claim: str, size: str, node_name: str) -> dict[str, Any]:
    """A ``local`` PersistentVolume on ``node_name``, bound ahead of time to ``claim``."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": volume_name(namespace, claim),
            "labels": {LABEL_NAMESPACE: namespace},
        },
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "local": {"path": str(host_path(namespace, claim))},
            "claimRef": {"namespace": namespace, "name": claim},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [node_name],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }


def persistent_volume_claim(namespace: str, claim: str, size: str) -> dict[str, Any]:
    """The claim :func:`persistent_volume` is bound to."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": STORAGE_CLASS,
            "volumeName": volume_name(namespace, claim),
            "resources": {"requests": {"storage": size}},
        },
    }
