"""A running local cluster as its users (tests, bench) see it: kubectl, helm, the API client.

    from localkube.handle import start_or_reuse

    cluster = start_or_reuse()          # reuse a live cluster or start one, and lease it
    cluster.kubectl("get", "nodes")
    env = cluster.env                   # os.environ + KUBECONFIG=<repo>/.cluster/kubeconfig
    image = cluster.trainer_image()     # this checkout's trainer image, on the real node
    path = cluster.local_volume(ns, "ckpt")    # claim "ckpt": a PersistentVolume on the node
    cluster.control_plane.release()     # stops it only if we started it and nobody else uses it

The pytest fixture ``cluster`` (tests/conftest.py) is this, for a whole test session.
``running_pod``, ``pod_pid`` (the trainer's host pid) and ``pod_log_lines`` (what a pod's runs
printed, kept past the kubelet's cleanup: node/podlogs.py) look at pods on the real node, where
every pod runs.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.kubeflow import (
    CONTAINER,
    JOBSET,
    LABEL_JOB_NAME,
    PYTORCHJOB,
    TRAINJOB,
    TRAINJOB_CONTAINER,
)

from .builds import gotools
from .cluster import ControlPlane
from .node import host, images, kubelet, podlogs, volumes
from .procs import LocalkubeError


@contextlib.contextmanager
def temporary_namespace(cluster, prefix: str, level: str = "baseline"):
    """A fresh namespace enforcing Pod Security ``level``, ready for pods (its default service
    account exists), deleted afterwards with whatever the test left in it."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    api = cluster.core_api()
    labels = {"pod-security.kubernetes.io/enforce": level}
    api.create_namespace({"metadata": {"name": name, "labels": labels}})
    wait_until(
        "default service account",
        lambda: _answered(lambda: api.read_namespaced_service_account("default", name)),
        30,
        0.1,
    )
    try:
        yield name
    finally:
        from kubernetes import client

        jobs = client.CustomObjectsApi(api.api_client)
        _answered(
            lambda: jobs.delete_collection_namespaced_custom_object(
                "kubeflow.org", "v1", name, "pytorchjobs"
            )
        )
        _answered(lambda: api.delete_namespace(name))
        cluster.delete_local_volumes(name)


def _answered(request):
    """The API server's answer to ``request()``; None when it answered with an error or not at
    all (for probes and clean-ups, as ``kubectl ... check=False``)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return request()
    except (ApiException, HTTPError):
        return None


def wait_until(what: str, probe, timeout: float = 60, interval: float = 0.5):
    """Poll ``probe()`` until it returns a truthy value; return it or fail naming ``what``.

    For tests that wait on the cluster's eventual state (a condition, an event, a pod).
    """
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


@dataclass
class Cluster:
    """A running local control plane, as seen by tests."""

    control_plane: ControlPlane
    kubeconfig: Path
    server: str
    started_here: bool  # True when a fixture (not `make cluster-up`) started it
    _trainer_image: str | None = None

    @property
    def kubectl_path(self) -> Path:
        """The kubectl built with the control plane (same minor version)."""
        return gotools.bin_path("kubectl")

    @property
    def helm_path(self) -> Path:
        """helm v3, built from source."""
        return gotools.bin_path("helm")

    @property
    def env(self) -> dict[str, str]:
        """``os.environ`` plus KUBECONFIG and PATH with the built kubectl/helm first."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{gotools.tools_dir() / 'bin'}:{env.get('PATH', '')}"
        return env

    def kubectl(
        self, *args: str, input_text: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        """Run kubectl against the cluster; raise on a non-zero exit when ``check``."""
        return self.control_plane.kubectl(
            *args, input_text=input_text, check=check, timeout=timeout
        )

    def helm(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        """Run helm against the cluster."""
        proc = subprocess.run(
            [str(self.helm_path), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def core_api(self):
        """A ``kubernetes.client.CoreV1Api`` for the admin user."""
        from kubernetes import client

        return client.CoreV1Api(self.api_client())

    def job_pods(self, name: str, namespace: str) -> list[dict[str, Any]]:
        """A PyTorchJob's pods as API dicts (through the API, not kubectl)."""
        resp = self.core_api().list_namespaced_pod(
            namespace, label_selector=f"{LABEL_JOB_NAME}={name}", _preload_content=False
        )
        return json.loads(resp.data)["items"]

    def running_pod(self, name: str, namespace: str, replica: str) -> dict[str, Any] | None:
        """The pod ``<name>-<replica>`` once its trainer runs (reported Running)."""
        for pod in self.job_pods(name, namespace):
            if pod["metadata"]["name"] != f"{name}-{replica}":
                continue
            statuses = pod.get("status", {}).get("containerStatuses") or []
            if (
                pod["status"].get("phase") == "Running"
                and statuses
                and statuses[0].get("state", {}).get("running")
            ):
                return pod
        return None

    def pod_pid(self, namespace: str, pod: dict[str, Any]) -> int | None:
        """The host pid of ``pod``'s trainer (its container's first process, PID 1 inside, from
        the containerd shim's ``init.pid``); None while it does not run."""
        for status in pod.get("status", {}).get("containerStatuses") or []:
            container_id = status.get("containerID", "")
            if not status.get("state", {}).get("running") or "://" not in container_id:
                continue
            task = host.CONTAINERD_STATE / "io.containerd.runtime.v2.task" / "k8s.io"
            try:
                return int((task / container_id.split("://", 1)[1] / "init.pid").read_text())
            except (OSError, ValueError):
                return None
        return None

    def pod_log_lines(
        self, namespace: str, pod_name: str, containers: tuple[str, ...] | None = None
    ) -> list[str]:
        """Everything every run of the pod named ``pod_name`` printed (each UID the name had,
        each restart), in order: the ground truth for a followed log. The training container
        (``pytorch`` or ``node``) unless ``containers`` names others, from the log keeper
        (node/podlogs.py)."""
        containers = containers or _TRAINING_CONTAINERS
        return podlogs.read_lines(self.log_keeper.files(namespace, pod_name, containers))

    @functools.cached_property
    def log_keeper(self) -> podlogs.LogKeeper:
        """The real node's container logs, kept from now on in ``.cluster/pod-logs``."""
        return podlogs.LogKeeper(self.control_plane.state_dir / "pod-logs").start()

    def trainer_image(self) -> str:
        """This checkout's trainer image, built if its code changed and imported into the real
        node's containerd if that holds another image ID; its reference (once per process)."""
        if self._trainer_image is None:
            host.require()
            self._trainer_image = images.import_trainer_image()
        return self._trainer_image

    def local_volume(self, namespace: str, claim: str, size: str = "1Gi") -> Path:
        """A ``local`` PersistentVolume on the real node and the claim ``claim`` bound to it
        in ``namespace`` (node/volumes.py); the folder on this machine that backs it. Deleted with
        the namespace by :func:`temporary_namespace`, or by ``down``."""
        host.require()
        path = volumes.host_path(namespace, claim)
        path.mkdir(parents=True, exist_ok=True)
        volume = volumes.persistent_volume(namespace, claim, size, kubelet.NODE_NAME)
        name = volume["metadata"]["name"]

        api = self.core_api()

        def volume_phase() -> str | None:
            return api.read_persistent_volume(name).status.phase

        def claim_phase() -> str | None:
            return api.read_namespaced_persistent_volume_claim(claim, namespace).status.phase

        def described(e: AssertionError) -> AssertionError:  # what the PV controller said
            said = (
                self.kubectl("describe", "pvc", claim, "-n", namespace, check=False).stdout
                + self.kubectl("describe", "pv", name, check=False).stdout
            )
            return AssertionError(f"{e}\n{said[-3000:]}")

        # The volume first, the claim once the PV controller holds the volume. Its claim worker
        # matches a claim only against the volumes its volume worker has synced, and a
        # pre-bound volume's sync does not requeue its claim (pv_controller.go, v1.33): a
        # claim synced first stays Pending until the resync of every claim, every 15 s.
        # "Available" is the phase that sync sets once the volume is in the controller's cache.
        api.create_persistent_volume(volume)
        try:
            wait_until(f"pv {name} Available", lambda: volume_phase() in AVAILABLE, 30, POLL_S)
        except AssertionError as e:
            raise described(e) from None
        claim_doc = volumes.persistent_volume_claim(namespace, claim, size)
        api.create_namespaced_persistent_volume_claim(namespace, claim_doc)
        # Even so, the claim worker's bind and the volume worker's sync of the volume it just
        # bound both set the volume's phase to Bound; the loser's write conflicts, and when the
        # loser is the claim worker the claim stays Pending, again until the resync ("Could not
        # sync claim ... the object has been modified", at -v=3). Any change to the claim syncs
        # it at once: every NUDGE_POLLS polls it is still Pending, a new annotation.
        polls = itertools.count(1)

        def bound() -> bool:
            if claim_phase() == "Bound":
                return True
            poll = next(polls)
            if poll % NUDGE_POLLS == 0:
                change = {"metadata": {"annotations": {SYNC_ANNOTATION: str(poll)}}}
                api.patch_namespaced_persistent_volume_claim(claim, namespace, change)
            return False

        try:
            wait_until(f"pvc {claim} Bound", bound, 30, POLL_S)
        except AssertionError as e:
            raise described(e) from None
        return path

    def delete_local_volumes(self, namespace: str) -> None:
        """Delete the PersistentVolumes of ``namespace``'s claims and their folders (the
        claims go with the namespace)."""
        selector = f"{volumes.LABEL_NAMESPACE}={namespace}"
        api = self.core_api()
        listed = _answered(lambda: api.list_persistent_volume(label_selector=selector))
        if listed is None:
            return
        _answered(lambda: api.delete_collection_persistent_volume(label_selector=selector))
        for pv in listed.items:
            path = Path(pv.spec.local.path)
            if path.parent == volumes.VOLUMES_DIR:
                shutil.rmtree(path, ignore_errors=True)

    def api_client(self):
        """Return a ``kubernetes.client.ApiClient`` for the admin user."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def get_json(self, *args: str, missing_ok: bool = False) -> Any:
        """What ``kubectl get ARGS -o json`` prints; None for an object that does not exist
        when ``missing_ok``. ``KIND [NAME] [-n NS] [-l SELECTOR] [--field-selector SELECTOR]``
        of a kind in :data:`READ_PATHS` is read through the API client (tests poll with it,
        and a kubectl process costs a tenth of a CPU-second); any other form, and any other
        answer than the object or its absence, through kubectl, which raises as it does."""
        from kubernetes.client.exceptions import ApiException

        path, query = _read_request(args)
        if path is not None:
            try:
                resp = self.api_client().call_api(
                    path, "GET", query_params=query, header_params={"Accept": "application/json"},
                    auth_settings=["BearerToken"], _preload_content=False,
                    _return_http_data_only=True,
                )  # fmt: skip
                return _as_kubectl_prints(json.loads(resp.data))
            except ApiException as e:
                if e.status == 404 and missing_ok:
                    return None
        got = self.kubectl("get", *args, "-o", "json", check=not missing_ok)
        if got.returncode == 0:
            return json.loads(got.stdout)
        if "NotFound" in got.stderr:  # only with missing_ok: kubectl raised otherwise
            return None
        raise LocalkubeError(f"localkube: kubectl get {' '.join(args)}: {got.stderr.strip()}")


#: The collection path of each kind :meth:`Cluster.get_json` reads through the API client, by
#: kubectl's names for it; ``{ns}`` where it is namespaced.
READ_PATHS = {
    ("pods", "pod", "po"): "/api/v1/namespaces/{ns}/pods",
    ("persistentvolumeclaims", "persistentvolumeclaim", "pvc"): (
        "/api/v1/namespaces/{ns}/persistentvolumeclaims"
    ),
    ("secrets", "secret"): "/api/v1/namespaces/{ns}/secrets",
    ("serviceaccounts", "serviceaccount", "sa"): "/api/v1/namespaces/{ns}/serviceaccounts",
    ("configmaps", "configmap", "cm"): "/api/v1/namespaces/{ns}/configmaps",
    ("nodes", "node", "no"): "/api/v1/nodes",
    ("jobs", "job"): "/apis/batch/v1/namespaces/{ns}/jobs",
    **{
        (api.plural, api.kind.lower()): f"/apis/{api.group}/{api.version}/namespaces/{{ns}}/"
        + api.plural
        for api in (PYTORCHJOB, TRAINJOB, JOBSET)
    },
}
_READ_FLAGS = {"-n": "namespace", "--namespace": "namespace", "-l": "labelSelector"}
_READ_FLAGS |= {"--selector": "labelSelector", "--field-selector": "fieldSelector"}


def _as_kubectl_prints(got: dict[str, Any]) -> dict[str, Any]:
    """An API answer as ``kubectl get -o json`` prints it: without managedFields, and a list as
    a ``List`` whose items name their kind and apiVersion (a list of a built-in kind leaves them
    out of its items)."""

    def shown(obj: dict[str, Any]) -> dict[str, Any]:
        obj.get("metadata", {}).pop("managedFields", None)
        return obj

    if "items" not in got or not got.get("kind", "").endswith("List"):
        return shown(got)
    kind, version = got["kind"].removesuffix("List"), got.get("apiVersion", "v1")
    items = [shown({"apiVersion": version, "kind": kind, **item}) for item in got["items"]]
    return {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}


def _read_request(args: tuple[str, ...]) -> tuple[str | None, list[tuple[str, str]]]:
    """The API path and query of ``kubectl get ARGS``; (None, []) for a form it does not map."""
    words, options = [], {}
    it = iter(args)
    for arg in it:
        if arg in _READ_FLAGS:
            options[_READ_FLAGS[arg]] = next(it, "")
        elif arg.startswith("-"):
            return None, []
        else:
            words.append(arg)
    kind = words[0] if words else ""
    base = next((path for names, path in READ_PATHS.items() if kind in names), None)
    namespace = options.pop("namespace", None)
    if base is None or len(words) > 2 or (len(words) == 2 and options):
        return None, []
    if "{ns}" not in base and namespace is not None:
        return None, []  # kubectl ignores -n for a cluster-scoped kind: leave it to kubectl
    path = base.format(ns=namespace or "default")  # kubectl's: the kubeconfig names none
    return (f"{path}/{words[1]}" if len(words) == 2 else path), sorted(options.items())


#: The phases of a volume the PV controller has synced (the claim may already have bound it).
AVAILABLE = ("Available", "Bound")
#: The claim's annotation :meth:`Cluster.local_volume` changes to have the PV controller sync it.
SYNC_ANNOTATION = "localkube.ddpjob.local/sync"
#: How often :meth:`Cluster.local_volume` reads the volume's and the claim's phase.
POLL_S = 0.05
#: Every how many polls a claim still Pending has that annotation changed (0.5 s; its bind
#: takes ~0.1 s).
NUDGE_POLLS = 10

#: The training container of a PyTorchJob's pods, and of a TrainJob's.
_TRAINING_CONTAINERS = (CONTAINER, TRAINJOB_CONTAINER)


def start_or_reuse(log=sys.stderr) -> Cluster:
    """Reuse a live cluster or start one, and hold a lease on it (``release()`` drops it).
    Its real node's container logs are kept from now on (``Cluster.log_keeper``)."""
    gotools.build(log)
    cp = ControlPlane(log=log)
    state = cp.up(owner="fixture", lease=True)
    cluster = Cluster(cp, cp.kubeconfig, state["server"], state.get("owner") == "fixture")
    if host.ENABLED:
        cluster.log_keeper  # noqa: B018 - started now, before any pod of this session runs
    return cluster
