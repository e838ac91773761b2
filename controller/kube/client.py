"""The one place that talks to the Kubernetes API: a connection and the calls ddpjob makes.

Everything else in ``controller`` works on plain dicts in the API's own JSON shape (camelCase,
exactly what ``kubectl get -o json`` prints), so the logic that reads them is pure and testable
without a cluster. Requests go to the API's raw paths through ``transport.py`` (urllib3), not the
generated ``kubernetes`` client: importing that costs about 0.5 s per command, and only users
whose kubeconfig runs a credential program (``exec``) pay it. ``--help``, ``validate`` and
``render`` import neither.

Every HTTP error and connection error goes through ``errors.translate``, the one choke point,
into one of ``controller.errors`` carrying the HTTP status, a reason code and the object it was
about. What the user should do about it is the CLI's business (``controller.cli.advice``).

Watches (:meth:`Cluster.watch`, in ``watch.py``) resume from the last resourceVersion and
re-list on 410 Gone; log streams (``logstream.py``) are re-attached by their reader. Nothing
here polls on a timer.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

from controller.errors import BadKubeconfig, ClusterError, NotFound, Unreachable
from controller.kube.errors import api_message, short_reason, translate
from controller.kube.logstream import LogStream, LogStreamBroken
from controller.kube.transport import ApiError, Transport
from controller.kube.watch import watch
from controller.kubeflow import PYTORCHJOB, TRAINJOB, JobAPI

# Requests that are not streams get a bounded wait: (connect, read) seconds.
REQUEST_TIMEOUT_S = (5, 60)


def _stderr_notice(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Cluster:
    """A connection to one cluster (kubeconfig + context) and the calls ddpjob makes on it.

    State lives here (the configured API client), so it is a class; methods return dicts.
    ``notice`` receives one-line progress notes (reconnecting, ...) meant for stderr.
    """

    def __init__(
        self,
        kubeconfig: str | None = None,
        context: str | None = None,
        notice: Callable[[str], None] = _stderr_notice,
    ):
        self.notice = notice
        self.kubeconfig = kubeconfig
        self.context = context
        self.transport = self._connect(kubeconfig, context)
        self.server = self.transport.host

    # ------------------------------------------------------------------------------------
    # Connection

    def default_namespace(self) -> str:
        """The kubeconfig context's namespace (inside a pod: the pod's), else ``default``."""
        return self.transport.namespace or "default"

    @staticmethod
    def _connect(kubeconfig: str | None, context: str | None) -> Transport:
        import os

        from controller.kube import transport

        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        try:
            return transport.connect(kubeconfig, context)
        except transport.ConfigError as e:
            raise BadKubeconfig(
                f"kubeconfig: cannot load {where} (got {e})",
                reason="NoKubeconfig" if e.missing else "BadKubeconfig",
                path=where,
            ) from None
        except ImportError:  # pragma: no cover - depends on the install
            raise Unreachable(
                "controller: this kubeconfig runs a credential program (exec), which needs the "
                "kubernetes client; it is not installed (got ImportError)",
                reason="ClientMissing",
            ) from None

    def _json(
        self,
        method: str,
        path: str,
        where: str,
        what: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
    ) -> dict[str, Any]:
        """One request; its JSON body as dicts ({} if empty); errors translated."""
        import urllib3

        try:
            resp = self.transport.request(
                method, path, query=query, body=body, timeout=REQUEST_TIMEOUT_S
            )
        except (ApiError, urllib3.exceptions.HTTPError, OSError) as e:
            raise translate(e, where, what, self.server) from None
        return json.loads(resp.data) if resp.data else {}

    def list_at(
        self, path: str, where: str, what: str, *, query: list[tuple[str, str]] | None = None
    ) -> dict[str, Any]:
        """The list at a raw collection ``path``, whole: its ``items`` and the
        ``metadata.resourceVersion`` a watch starts from (``watch.py``); errors translated."""
        return self._json("GET", path, where, what, query=query)

    # ------------------------------------------------------------------------------------
    # Discovery and checks

    def version(self) -> dict[str, Any]:
        """The API server's /version (gitVersion, ...)."""
        return self._json("GET", "/version", "cluster", "version")

    def job_api_served(self, api: JobAPI = PYTORCHJOB) -> bool:
        """True when the API server serves ``api`` (its CRD is installed)."""
        try:
            body = self._json("GET", f"/apis/{api.group}/{api.version}", "cluster", api.kind)
        except NotFound:
            return False
        return any(r.get("name") == api.plural for r in body.get("resources", []))

    def can_i(
        self,
        verb: str,
        resource: str,
        *,
        group: str = "",
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> tuple[bool, str]:
        """A SelfSubjectAccessReview: may the current user do ``verb`` on ``resource``?"""
        attrs: dict[str, Any] = {"verb": verb, "resource": resource, "group": group}
        if namespace:
            attrs["namespace"] = namespace
        if subresource:
            attrs["subresource"] = subresource
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs},
        }
        path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
        out = self._json("POST", path, "cluster", path, body=review)
        status = out.get("status", {})
        return bool(status.get("allowed")), status.get("reason", "") or ""

    # ------------------------------------------------------------------------------------
    # Jobs (a Kubeflow job API: PyTorchJob by default)

    def get_job(self, name: str, namespace: str, api: JobAPI = PYTORCHJOB) -> dict[str, Any]:
        path = _jobs_path(api, namespace, name)
        return self._json("GET", path, "job", f"{api.kind} {namespace}/{name}")

    def list_jobs(
        self, namespace: str, selector: str | None = None, api: JobAPI = PYTORCHJOB
    ) -> list[dict[str, Any]]:
        query = [("labelSelector", selector)] if selector else None
        body = self._json(
            "GET",
            _jobs_path(api, namespace),
            "list",
            f"{api.kind} list in {namespace}",
            query=query,
        )
        return body.get("items", [])

    def create_job(self, manifest: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Create the job ``manifest`` describes (its apiVersion/kind pick the API)."""
        api = api_of(manifest)
        meta = manifest.get("metadata", {})
        namespace, name = meta.get("namespace", "default"), meta.get("name", "?")
        return self._json(
            "POST",
            _jobs_path(api, namespace),
            "submit",
            f"{api.kind} {namespace}/{name}",
            query=[("dryRun", "All")] if dry_run else None,
            body=manifest,
        )

    def create_beside(
        self, manifest: dict[str, Any], owner: dict[str, Any] | None, *, dry_run: bool = False
    ) -> dict[str, Any]:
        """Create an object that goes with a job (a ConfigMap, a PodMonitor: any namespaced
        kind whose plural is its lowercase kind + s), owned by the created job ``owner`` (so
        it goes when the job goes); ``owner`` None: not owned (a dry run)."""
        meta = dict(manifest.get("metadata", {}))
        namespace, name = meta.get("namespace", "default"), meta.get("name", "?")
        if owner is not None:
            ref = {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
            }
            meta["ownerReferences"] = [ref]
        version, kind = manifest["apiVersion"], manifest["kind"]
        base = f"/api/{version}" if "/" not in version else f"/apis/{version}"
        return self._json(
            "POST",
            f"{base}/namespaces/{_q(namespace)}/{kind.lower()}s",
            "submit",
            f"{kind} {namespace}/{name}",
            query=[("dryRun", "All")] if dry_run else None,
            body={**manifest, "metadata": meta},
        )

    def delete_job(self, name: str, namespace: str, api: JobAPI = PYTORCHJOB) -> dict[str, Any]:
        # A PyTorchJob: foreground, the job object stays (with a deletionTimestamp) until the
        # garbage collector has removed its pods. A TrainJob: background, the object goes at
        # once and the collector takes its JobSet, Jobs and pods after it. Kubeflow Trainer
        # (v2.3.0) creates the JobSet again while a TrainJob it still sees is being deleted, and
        # each round of that lasts the pods' grace period: under foreground deletion a resumed
        # TrainJob on the local node was still there after 120 s, twice in a row. wait_deleted
        # waits for the pods either way.
        policy = "Background" if api is TRAINJOB else "Foreground"
        return self._json(
            "DELETE",
            _jobs_path(api, namespace, name),
            "delete",
            f"{api.kind} {namespace}/{name}",
            query=[("propagationPolicy", policy)],
        )

    def get_cluster_object(self, api: JobAPI, name: str) -> dict[str, Any]:
        """A cluster-scoped custom object (a ClusterTrainingRuntime, ...)."""
        return self.get_object(api, name)

    def get_object(self, api: JobAPI, name: str, namespace: str | None = None) -> dict[str, Any]:
        """A custom object: namespaced when ``namespace`` is given, else cluster-scoped."""
        what = f"{api.kind} {namespace}/{name}" if namespace else f"{api.kind} {name}"
        return self._json("GET", _objects_path(api, namespace, name), "get", what)

    def list_objects(
        self, api: JobAPI, namespace: str | None = None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Custom objects of ``api`` in ``namespace`` (every namespace when None, or a
        cluster-scoped kind). NotFound with reason APINotServed when the API is not served."""
        query = [("labelSelector", selector)] if selector else None
        where = f"{api.kind} list" + (f" in {namespace}" if namespace else "")
        try:
            body = self._json("GET", _objects_path(api, namespace), "list", where, query=query)
        except NotFound as e:
            if e.reason == "NamespaceNotFound":
                raise
            raise NotFound(
                f"list: the cluster does not serve {api.plural}.{api.group} (got {e})",
                reason="APINotServed",
            ) from None
        return body.get("items", [])

    def pending_workloads(self, namespace: str, local_queue: str) -> list[dict[str, Any]] | None:
        """Kueue's visibility API: the LocalQueue's pending workloads with their positions
        (``positionInLocalQueue``, ``positionInClusterQueue``), or None where the cluster does
        not serve it (its APIService is not installed, or not reachable) or the user may not
        read it."""
        from controller.kubeflow import VISIBILITY_GROUP_VERSION

        path = (
            f"/apis/{VISIBILITY_GROUP_VERSION}/namespaces/{_q(namespace)}/localqueues/"
            f"{_q(local_queue)}/pendingworkloads"
        )
        try:
            body = self._json("GET", path, "queue", f"pending workloads of {local_queue}")
        except ClusterError:
            return None
        return body.get("items", [])

    # ------------------------------------------------------------------------------------
    # Pods, logs, events, nodes

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        path = f"/api/v1/namespaces/{_q(namespace)}/pods"
        body = self._json(
            "GET", path, "pods", f"pods {selector}", query=[("labelSelector", selector)]
        )
        return body.get("items", [])

    def get_pod(self, name: str, namespace: str) -> dict[str, Any]:
        path = f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}"
        return self._json("GET", path, "pod", f"pod {namespace}/{name}")

    def list_pods_all_namespaces(self, selector: str) -> list[dict[str, Any]]:
        query = [("labelSelector", selector)]
        body = self._json("GET", "/api/v1/pods", "pods", f"pods {selector}", query=query)
        return body.get("items", [])

    def list_events(
        self, namespace: str, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        query = [("fieldSelector", field_selector)] if field_selector else None
        path = f"/api/v1/namespaces/{_q(namespace)}/events"
        return self._json("GET", path, "events", "events", query=query).get("items", [])

    def get_config_map(self, name: str, namespace: str) -> dict[str, Any]:
        path = f"/api/v1/namespaces/{_q(namespace)}/configmaps/{_q(name)}"
        return self._json("GET", path, "configmap", f"ConfigMap {namespace}/{name}")

    def list_nodes(self) -> list[dict[str, Any]]:
        return self._json("GET", "/api/v1/nodes", "nodes", "nodes").get("items", [])

    def read_log(
        self,
        pod: str,
        namespace: str,
        *,
        container: str,
        tail_lines: int | None = None,
        previous: bool = False,
        timestamps: bool = False,
    ) -> str:
        """A container's log (not followed), as text."""
        import urllib3

        query = _log_query(container, False, previous, timestamps, None, tail_lines)
        try:
            resp = self.transport.request(
                "GET", _log_path(namespace, pod), query=query, timeout=REQUEST_TIMEOUT_S
            )
        except ApiError as e:
            raise _log_error(e, namespace, pod, self.server) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise translate(e, "logs", f"pod {namespace}/{pod}", self.server) from None
        return resp.data.decode("utf-8", errors="replace")

    def stream_log(
        self,
        pod: str,
        namespace: str,
        *,
        container: str,
        previous: bool = False,
        follow: bool = True,
        since_time: str | None = None,
        timestamps: bool = True,
        tail_lines: int | None = None,
    ) -> LogStream:
        """Open a container's log as a stream: followed unless ``follow`` is False or the log is
        the ``previous`` run's; from ``since_time`` (RFC 3339) on, or its last ``tail_lines``.

        Connection errors propagate as ``LogStreamBroken`` so the caller can re-attach; API
        errors are translated (pod gone: NotFound; container not started: NotFound, NoLogYet).
        """
        import urllib3

        follow = follow and not previous
        query = _log_query(container, follow, previous, timestamps, since_time, tail_lines)
        try:
            resp = self.transport.request(
                "GET",
                _log_path(namespace, pod),
                query=query,
                # No read timeout: a quiet trainer may print nothing for minutes.
                timeout=(REQUEST_TIMEOUT_S[0], None),
                stream=True,
            )
        except ApiError as e:
            raise _log_error(e, namespace, pod, self.server) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise LogStreamBroken(short_reason(e)) from None
        return LogStream(resp, followed=follow)

    # ------------------------------------------------------------------------------------
    # Watches

    def watch(
        self,
        kind: str,
        namespace: str,
        *,
        selector: str | None = None,
        field_selector: str | None = None,
        deadline: float | None = None,
        api: JobAPI = PYTORCHJOB,
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Yield ``(event_type, object)`` for ``kind`` in {"job", "pod", "event"}; see
        :func:`controller.kube.watch.watch`."""
        if kind == "job":
            path = _jobs_path(api, namespace)
        elif kind in ("pod", "event"):
            path = f"/api/v1/namespaces/{_q(namespace)}/{kind}s"
        else:
            raise ValueError(f"watch: unknown kind {kind!r}")
        return watch(
            self,
            path,
            f"watch {kind}s",
            kind,
            selector=selector,
            field_selector=field_selector,
            deadline=deadline,
        )


def _q(name: str) -> str:
    """One path segment (a name or namespace), quoted: a stray ``/`` cannot change the path."""
    return quote(name, safe="")


def _objects_path(api: JobAPI, namespace: str | None, name: str | None = None) -> str:
    path = f"/apis/{api.group}/{api.version}"
    if namespace:
        path += f"/namespaces/{_q(namespace)}"
    path += f"/{api.plural}"
    return f"{path}/{_q(name)}" if name else path


def _jobs_path(api: JobAPI, namespace: str, name: str | None = None) -> str:
    path = f"/apis/{api.group}/{api.version}/namespaces/{_q(namespace)}/{api.plural}"
    return f"{path}/{_q(name)}" if name else path


def _log_path(namespace: str, pod: str) -> str:
    return f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(pod)}/log"


def _log_query(
    container: str,
    follow: bool,
    previous: bool,
    timestamps: bool,
    since_time: str | None,
    tail_lines: int | None,
) -> list[tuple[str, str]]:
    query = [
        ("container", container),
        ("follow", "true" if follow else "false"),
        ("previous", "true" if previous else "false"),
        ("timestamps", "true" if timestamps else "false"),
    ]
    if since_time:
        query.append(("sinceTime", since_time))
    if tail_lines is not None:
        query.append(("tailLines", str(tail_lines)))
    return query


def _log_error(exc: Any, namespace: str, pod: str, server: str) -> ClusterError:
    """A refused log request: 400 means the container has not started or has no previous run
    (NotFound, reason NoLogYet, which a follower waits out); anything else is translated."""
    if exc.status == 400:
        return NotFound(
            f"logs: no log for pod {namespace}/{pod} yet (got 400 {api_message(exc)})",
            status=400,
            reason="NoLogYet",
        )
    return translate(exc, "logs", f"pod {namespace}/{pod}", server)


def api_of(manifest: dict[str, Any]) -> JobAPI:
    """The job API a rendered manifest belongs to (by apiVersion and kind)."""
    from controller import kubeflow

    for api in kubeflow.JOB_APIS:
        if manifest.get("apiVersion") == api.api_version and manifest.get("kind") == api.kind:
            return api
    raise ValueError(
        f"submit: not a job ddpjob knows (got {manifest.get('apiVersion')} {manifest.get('kind')})"
    )
