"""The one place that talks to the Kubernetes API: a connection and the calls ddpjob makes.

Everything else in ``controller`` works on plain dicts in the API's own JSON shape (camelCase,
exactly what ``kubectl get -o json`` prints), so the logic that reads them is pure and testable
without a cluster. The ``kubernetes`` client is imported lazily, inside the methods: ``--help``,
``validate`` and ``render`` never pay for it.

Every ``ApiException`` and connection error goes through ``errors.translate``, the one choke point,
into one of ``controller.errors`` carrying the HTTP status, a reason code and the object it was
about. What the user should do about it is the CLI's business (``controller.cli.advice``).

Watches (:meth:`Cluster.watch`, in ``watch.py``) resume from the last resourceVersion and
re-list on 410 Gone; log streams (``logstream.py``) are re-attached by their reader. Nothing
here polls on a timer.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

from controller.errors import ClusterError, NotFound, Unreachable
from controller.kube import tally
from controller.kube.errors import api_message, short_reason, translate
from controller.kube.logstream import LogStream, LogStreamBroken
from controller.kube.watch import watch
from controller.kubeflow import PYTORCHJOB, JobAPI

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
        self._api = self._connect(kubeconfig, context)
        self.server = self._api.configuration.host

    # ------------------------------------------------------------------------------------
    # Connection

    def default_namespace(self) -> str:
        """The kubeconfig context's namespace, else ``default``."""
        import os

        if not self.kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
            path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
            with contextlib.suppress(OSError), open(path) as f:
                return f.read().strip() or "default"
        from kubernetes import config

        try:
            _, active = config.list_kube_config_contexts(config_file=self.kubeconfig)
        except (config.ConfigException, OSError):
            return "default"
        if self.context:
            contexts, _ = config.list_kube_config_contexts(config_file=self.kubeconfig)
            active = next((c for c in contexts if c.get("name") == self.context), active)
        return (active or {}).get("context", {}).get("namespace") or "default"

    @staticmethod
    def _connect(kubeconfig: str | None, context: str | None) -> Any:
        import os

        try:
            from kubernetes import client, config
        except ImportError:  # pragma: no cover - depends on the install
            raise ClusterError(
                "controller: the kubernetes client is not installed (got ImportError)",
                reason="ClientMissing",
            ) from None
        configuration = client.Configuration()
        try:
            if kubeconfig or not os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_kube_config(
                    config_file=kubeconfig,
                    context=context,
                    client_configuration=configuration,
                    persist_config=False,
                )
            else:  # inside a pod: the service account's token
                config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as e:
            where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise Unreachable(
                f"kubeconfig: cannot load {where} (got {str(e).strip() or type(e).__name__})",
                reason="NoKubeconfig",
            ) from None
        except (OSError, ValueError) as e:
            raise Unreachable(f"kubeconfig: {e}", reason="NoKubeconfig") from None
        # Fail fast while the API server is away; watches and log streams retry on their own.
        configuration.retries = 1
        api = client.ApiClient(configuration)
        api.rest_client.request = tally.counting(api.rest_client.request)  # --debug prints it
        return api

    def _call(
        self, where: str, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Call ``fn`` and return its JSON body as dicts; errors translated."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT_S)
        kwargs["_preload_content"] = False
        try:
            resp = fn(*args, **kwargs)
            data = resp.data
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise translate(e, where, what, self.server) from None
        if not data:
            return {}
        return json.loads(data)

    def _call_raw(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """One request on a raw path (discovery, reviews); JSON in, JSON out."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self._api.call_api(
                path,
                method,
                body=body,
                header_params={"Accept": "application/json", "Content-Type": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise translate(e, "cluster", path, self.server) from None
        data = resp[0].data
        return json.loads(data) if data else {}

    # ------------------------------------------------------------------------------------
    # API groups

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self._api)

    @property
    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self._api)

    # ------------------------------------------------------------------------------------
    # Discovery and checks

    def version(self) -> dict[str, Any]:
        """The API server's /version (gitVersion, ...)."""
        from kubernetes import client

        return self._call("cluster", "version", client.VersionApi(self._api).get_code)

    def job_api_served(self, api: JobAPI = PYTORCHJOB) -> bool:
        """True when the API server serves ``api`` (its CRD is installed)."""
        try:
            body = self._call_raw("GET", f"/apis/{api.group}/{api.version}")
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
        out = self._call_raw(
            "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review
        )
        status = out.get("status", {})
        return bool(status.get("allowed")), status.get("reason", "") or ""

    # ------------------------------------------------------------------------------------
    # Jobs (a Kubeflow job API: PyTorchJob by default)

    def get_job(self, name: str, namespace: str, api: JobAPI = PYTORCHJOB) -> dict[str, Any]:
        return self._call(
            "job",
            f"{api.kind} {namespace}/{name}",
            self.custom.get_namespaced_custom_object,
            api.group,
            api.version,
            namespace,
            api.plural,
            name,
        )

    def list_jobs(
        self, namespace: str, selector: str | None = None, api: JobAPI = PYTORCHJOB
    ) -> list[dict[str, Any]]:
        kwargs = {"label_selector": selector} if selector else {}
        body = self._call(
            "list",
            f"{api.kind} list in {namespace}",
            self.custom.list_namespaced_custom_object,
            api.group,
            api.version,
            namespace,
            api.plural,
            **kwargs,
        )
        return body.get("items", [])

    def create_job(self, manifest: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Create the job ``manifest`` describes (its apiVersion/kind pick the API)."""
        api = api_of(manifest)
        meta = manifest.get("metadata", {})
        namespace, name = meta.get("namespace", "default"), meta.get("name", "?")
        kwargs = {"dry_run": "All"} if dry_run else {}
        return self._call(
            "submit",
            f"{api.kind} {namespace}/{name}",
            self.custom.create_namespaced_custom_object,
            api.group,
            api.version,
            namespace,
            api.plural,
            manifest,
            **kwargs,
        )

    def delete_job(self, name: str, namespace: str, api: JobAPI = PYTORCHJOB) -> dict[str, Any]:
        # Foreground: the job object stays (with a deletionTimestamp) until the garbage collector
        # has removed its pods, so waiting for the job to vanish waits for the pods too.
        return self._call(
            "delete",
            f"{api.kind} {namespace}/{name}",
            self.custom.delete_namespaced_custom_object,
            api.group,
            api.version,
            namespace,
            api.plural,
            name,
            propagation_policy="Foreground",
        )

    def get_cluster_object(self, api: JobAPI, name: str) -> dict[str, Any]:
        """A cluster-scoped custom object (a ClusterTrainingRuntime, ...)."""
        return self._call(
            "get",
            f"{api.kind} {name}",
            self.custom.get_cluster_custom_object,
            api.group,
            api.version,
            api.plural,
            name,
        )

    # ------------------------------------------------------------------------------------
    # Pods, logs, events, nodes

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        body = self._call(
            "pods",
            f"pods {selector}",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=selector,
        )
        return body.get("items", [])

    def get_pod(self, name: str, namespace: str) -> dict[str, Any]:
        return self._call(
            "pod", f"pod {namespace}/{name}", self.core.read_namespaced_pod, name, namespace
        )

    def list_pods_all_namespaces(self, selector: str) -> list[dict[str, Any]]:
        body = self._call(
            "pods",
            f"pods {selector}",
            self.core.list_pod_for_all_namespaces,
            label_selector=selector,
        )
        return body.get("items", [])

    def list_events(
        self, namespace: str, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        kwargs = {"field_selector": field_selector} if field_selector else {}
        body = self._call("events", "events", self.core.list_namespaced_event, namespace, **kwargs)
        return body.get("items", [])

    def list_nodes(self) -> list[dict[str, Any]]:
        return self._call("nodes", "nodes", self.core.list_node).get("items", [])

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
        from kubernetes.client.exceptions import ApiException

        kwargs: dict[str, Any] = {
            "container": container,
            "timestamps": timestamps,
            "previous": previous,
        }
        if tail_lines is not None:
            kwargs["tail_lines"] = tail_lines
        try:
            resp = self.core.read_namespaced_pod_log(
                pod,
                namespace,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_S,
                **kwargs,
            )
            return resp.data.decode("utf-8", errors="replace")
        except ApiException as e:
            raise _log_error(e, namespace, pod, self.server) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise translate(e, "logs", f"pod {namespace}/{pod}", self.server) from None

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
        from kubernetes.client.exceptions import ApiException

        # The generated client has no sinceTime: the request is made on the raw path.
        query = [
            ("container", container),
            ("follow", "true" if follow and not previous else "false"),
            ("previous", "true" if previous else "false"),
            ("timestamps", "true" if timestamps else "false"),
        ]
        if since_time:
            query.append(("sinceTime", since_time))
        if tail_lines is not None:
            query.append(("tailLines", str(tail_lines)))
        try:
            resp, *_ = self._api.call_api(
                f"/api/v1/namespaces/{namespace}/pods/{pod}/log",
                "GET",
                query_params=query,
                header_params={"Accept": "*/*"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                # No read timeout: a quiet trainer may print nothing for minutes.
                _request_timeout=(REQUEST_TIMEOUT_S[0], None),
            )
        except ApiException as e:
            raise _log_error(e, namespace, pod, self.server) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise LogStreamBroken(short_reason(e)) from None
        return LogStream(resp)

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
        return watch(
            self,
            self._list_fn(kind, namespace, api),
            f"watch {kind}s",
            kind,
            selector=selector,
            field_selector=field_selector,
            deadline=deadline,
        )

    def _list_fn(self, kind: str, namespace: str, api: JobAPI) -> Callable[..., Any]:
        import functools

        if kind == "job":
            return functools.partial(
                self.custom.list_namespaced_custom_object,
                api.group,
                api.version,
                namespace,
                api.plural,
            )
        if kind == "pod":
            return functools.partial(self.core.list_namespaced_pod, namespace)
        if kind == "event":
            return functools.partial(self.core.list_namespaced_event, namespace)
        raise ValueError(f"watch: unknown kind {kind!r}")


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
