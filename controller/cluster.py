"""The one module that talks to the Kubernetes API.

Everything else in ``controller`` works on plain dicts in the API's own JSON shape (camelCase,
exactly what ``kubectl get -o json`` prints), so the logic that reads them is pure and testable
without a cluster. The ``kubernetes`` client is imported lazily, inside the methods: ``--help``,
``validate`` and ``render`` never pay for it. Every ``ApiException`` and connection error is
translated here, where it happens, into one of ``controller.errors`` with a line that names the
fix.

Watches (``Cluster.watch``) resume from the last resourceVersion after a dropped connection,
re-list on 410 Gone, and ride out an API server restart; nothing here polls on a timer.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from controller.errors import (
    ClusterError,
    Conflict,
    Forbidden,
    NotFound,
    Unreachable,
    UserError,
)

# The PyTorchJob API of the Kubeflow training operator v1.
JOB_GROUP = "kubeflow.org"
JOB_VERSION = "v1"
JOB_PLURAL = "pytorchjobs"
JOB_KIND = "PyTorchJob"
CRD_NAME = f"{JOB_PLURAL}.{JOB_GROUP}"

# Labels the operator puts on every pod it creates for a job.
LABEL_JOB_NAME = "training.kubeflow.org/job-name"
LABEL_REPLICA_TYPE = "training.kubeflow.org/replica-type"  # master | worker
LABEL_REPLICA_INDEX = "training.kubeflow.org/replica-index"
LABEL_JOB_ROLE = "training.kubeflow.org/job-role"  # "master" on the master pod only
CONTAINER = "pytorch"  # the operator requires this container name

# The upstream manifests label the operator's pod with this (kubeflow/training-operator
# manifests/base/deployment.yaml).
OPERATOR_POD_SELECTOR = "control-plane=kubeflow-training-operator"

# Requests that are not streams get a bounded wait: (connect, read) seconds.
REQUEST_TIMEOUT_S = (5, 60)
# A watch asks the server to end it after this long (it is then resumed from the last
# resourceVersion); the client read timeout sits a little above it, and bookmarks keep the
# resourceVersion fresh in between.
WATCH_SERVER_TIMEOUT_S = 240
# Backoff between reconnect attempts while the API server is away.
RECONNECT_BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)
# A watch gives up when the API server has been away this long.
RECONNECT_GIVE_UP_S = 300

# What a watch reports besides ADDED / MODIFIED / DELETED.
RESYNC = "RESYNC"  # a fresh list replaced the watch (after 410 Gone or a long outage)

KUBECONFIG_HINT = (
    "Point at a cluster: `export KUBECONFIG=/path/to/kubeconfig` (for the local control plane: "
    "`make cluster-up`, then `export KUBECONFIG=$PWD/.cluster/kubeconfig`)"
)


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
    # Connection and error translation

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
                "controller: the kubernetes client is not installed (got ImportError). "
                "Install the controller extra: `pip install 'ddpjob[controller]'`"
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
                f"kubeconfig: cannot load {where} (got {str(e).strip() or type(e).__name__}). "
                f"{KUBECONFIG_HINT}"
            ) from None
        except (OSError, ValueError) as e:
            raise Unreachable(f"kubeconfig: {e}. {KUBECONFIG_HINT}") from None
        # Fail fast while the API server is away; watches and log streams retry on their own.
        configuration.retries = 1
        return client.ApiClient(configuration)

    def _translate(self, exc: BaseException, where: str, what: str = "") -> Exception:
        """Map a client exception to a project error (returned, for ``raise ... from``)."""
        from kubernetes.client.exceptions import ApiException

        if not isinstance(exc, ApiException):
            return Unreachable(
                f"{where}: the API server at {self.server} does not answer "
                f"(got {_short_reason(exc)}). Is the cluster up? {KUBECONFIG_HINT}"
            )
        status = exc.status or 0
        message = _api_message(exc)
        if status == 401:
            return Unreachable(
                f"{where}: the API server rejected our credentials (got 401 {message}). "
                "Refresh the kubeconfig's token or certificate"
            )
        if status == 403 and "admission webhook" in message:
            return UserError(f"{where}: the cluster refused {what or 'the request'} ({message})")
        if status == 403:
            return Forbidden(
                f"{where}: RBAC forbids this (got {message}). Ask a cluster admin for a Role "
                "with that verb on that resource (k8s/rbac.yaml lists what ddpjob needs), "
                "and run `python -m controller doctor` to see every missing permission"
            )
        if status == 404 and what.startswith("PyTorchJob") and _crd_missing(exc):
            return NotFound(
                f"{where}: the cluster does not serve {CRD_NAME} (got 404 {message}). "
                "Install the Kubeflow training operator: `kubectl apply --server-side -k "
                '"github.com/kubeflow/training-operator.git/manifests/overlays/standalone'
                '?ref=v1.9.2"`'
            )
        if status == 404 and _details(exc).get("kind") == "namespaces":
            ns = _details(exc).get("name", "?")
            return NotFound(
                f"{where}: namespace {ns} does not exist (got 404 {message}). Create it "
                f"(`kubectl create namespace {ns}`) or pick another with -n / `namespace:`"
            )
        if status == 404:
            hint = ""
            if what.startswith("PyTorchJob "):
                ns = what.split(" ", 1)[1].split("/", 1)[0]
                hint = f". Check the name and namespace: `python -m controller list -n {ns}`"
            return NotFound(f"{where}: {what or 'object'} not found (got 404 {message}){hint}")
        if status == 409:
            return Conflict(
                f"{where}: {what or 'the object'} already exists (got 409 {message}). "
                "Use --replace to delete it and submit again, or change `name:` in the spec"
            )
        if status in (400, 422):
            return UserError(
                f"{where}: the API server rejected {what or 'the request'} (got {status} {message})"
            )
        if "failed calling webhook" in message:
            return ClusterError(
                f"{where}: the training operator's admission webhook did not answer "
                f"(got {status} {message}). Is the operator running? "
                "`python -m controller doctor`"
            )
        return ClusterError(
            f"{where}: the API server failed (got {status} {message}). "
            "Retry; if it persists, check the API server's health"
        )

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
            raise self._translate(e, where, what) from None
        if not data:
            return {}
        return json.loads(data)

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

    def job_api_served(self) -> bool:
        """True when the API server serves kubeflow.org/v1 pytorchjobs (the CRD is installed)."""
        from kubernetes.client.exceptions import ApiException

        try:
            body = self._call_raw("GET", f"/apis/{JOB_GROUP}/{JOB_VERSION}")
        except NotFound:
            return False
        except ApiException:  # pragma: no cover - _call_raw translates
            raise
        return any(r.get("name") == JOB_PLURAL for r in body.get("resources", []))

    def _call_raw(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """One request on a raw path (discovery); JSON in, JSON out."""
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
            raise self._translate(e, "cluster", path) from None
        data = resp[0].data
        return json.loads(data) if data else {}

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
    # PyTorchJobs

    def get_job(self, name: str, namespace: str) -> dict[str, Any]:
        return self._call(
            "job",
            f"PyTorchJob {namespace}/{name}",
            self.custom.get_namespaced_custom_object,
            JOB_GROUP,
            JOB_VERSION,
            namespace,
            JOB_PLURAL,
            name,
        )

    def list_jobs(self, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        kwargs = {"label_selector": selector} if selector else {}
        body = self._call(
            "list",
            f"PyTorchJob list in {namespace}",
            self.custom.list_namespaced_custom_object,
            JOB_GROUP,
            JOB_VERSION,
            namespace,
            JOB_PLURAL,
            **kwargs,
        )
        return body.get("items", [])

    def create_job(self, manifest: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        meta = manifest.get("metadata", {})
        namespace, name = meta.get("namespace", "default"), meta.get("name", "?")
        kwargs = {"dry_run": "All"} if dry_run else {}
        return self._call(
            "submit",
            f"PyTorchJob {namespace}/{name}",
            self.custom.create_namespaced_custom_object,
            JOB_GROUP,
            JOB_VERSION,
            namespace,
            JOB_PLURAL,
            manifest,
            **kwargs,
        )

    def delete_job(self, name: str, namespace: str) -> dict[str, Any]:
        # Foreground: the job object stays (with a deletionTimestamp) until the garbage collector
        # has removed its pods, so waiting for the job to vanish waits for the pods too.
        return self._call(
            "delete",
            f"PyTorchJob {namespace}/{name}",
            self.custom.delete_namespaced_custom_object,
            JOB_GROUP,
            JOB_VERSION,
            namespace,
            JOB_PLURAL,
            name,
            propagation_policy="Foreground",
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
        tail_lines: int | None = None,
        previous: bool = False,
        timestamps: bool = False,
    ) -> str:
        """A container's log (not followed), as text."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        kwargs: dict[str, Any] = {
            "container": CONTAINER,
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
            if e.status == 400:  # the container has not started, or has no previous run
                raise NotFound(
                    f"logs: no log for pod {namespace}/{pod} yet (got 400 {_api_message(e)})"
                ) from None
            raise self._translate(e, "logs", f"pod {namespace}/{pod}") from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise self._translate(e, "logs", f"pod {namespace}/{pod}") from None

    def stream_log(self, pod: str, namespace: str, *, previous: bool = False) -> Any:
        """Open a followed log stream (timestamps on); returns a ``LogStream``.

        Connection errors propagate untranslated as ``LogStreamBroken`` so the follower can
        re-attach; API errors (pod gone, container not started) are translated.
        """
        import urllib3
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self.core.read_namespaced_pod_log(
                pod,
                namespace,
                container=CONTAINER,
                follow=not previous,
                timestamps=True,
                previous=previous,
                _preload_content=False,
                # No read timeout: a quiet trainer may print nothing for minutes.
                _request_timeout=(REQUEST_TIMEOUT_S[0], None),
            )
        except ApiException as e:
            if e.status in (400, 404):  # waiting to start / already gone: the caller decides
                raise LogStreamBroken(_api_message(e)) from None
            raise self._translate(e, "logs", f"pod {namespace}/{pod}") from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise LogStreamBroken(_short_reason(e)) from None
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
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Yield ``(event_type, object)`` for ``kind`` in {"job", "pod", "event"}, forever.

        Starts with a list (each item reported as ADDED, then ``(RESYNC, {"count": n})``),
        then watches from its resourceVersion. A dropped connection resumes from the last
        resourceVersion seen (bookmarks keep it fresh); 410 Gone re-lists, reporting objects
        that vanished meanwhile as DELETED; while the API server is away it retries with a
        short backoff. Ends (returns) at ``deadline`` (time.monotonic()).
        """
        import urllib3
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines

        list_fn = self._list_fn(kind, namespace)
        where = f"watch {kind}s"
        kwargs: dict[str, Any] = {}
        if selector:
            kwargs["label_selector"] = selector
        if field_selector:
            kwargs["field_selector"] = field_selector
        known: dict[str, dict[str, Any]] = {}  # uid -> latest object
        rv: str | None = None
        outage = _Outage(self, where)
        while deadline is None or time.monotonic() < deadline:
            try:
                if rv is None:
                    body = self._call(where, kind, list_fn, **kwargs)
                    outage.over()
                    rv = body.get("metadata", {}).get("resourceVersion")
                    items = body.get("items", [])
                    yield from _resync(known, items)
                    yield RESYNC, {"count": len(items)}
                server_timeout = WATCH_SERVER_TIMEOUT_S
                if deadline is not None:
                    server_timeout = max(
                        1, min(server_timeout, int(deadline - time.monotonic()) + 1)
                    )
                resp = list_fn(
                    watch=True,
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=server_timeout,
                    _preload_content=False,
                    _request_timeout=(REQUEST_TIMEOUT_S[0], server_timeout + 30),
                    **kwargs,
                )
                try:
                    for line in iter_resp_lines(resp):
                        event = json.loads(line)
                        etype, obj = event.get("type"), event.get("object", {})
                        if etype == "ERROR":
                            if obj.get("code") == 410:
                                rv = None  # expired: list again
                                break
                            raise ClusterError(
                                f"{where}: the API server ended the watch "
                                f"(got {obj.get('code')} {obj.get('message')})"
                            )
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        outage.over()
                        if etype == "BOOKMARK":
                            continue
                        uid = obj.get("metadata", {}).get("uid", "")
                        if etype == "DELETED":
                            known.pop(uid, None)
                        else:
                            known[uid] = obj
                        yield etype, obj
                        if deadline is not None and time.monotonic() >= deadline:
                            return
                finally:
                    resp.close()  # not back to the pool: the stream may be mid-chunk
                    resp.release_conn()
            except ApiException as e:
                if e.status == 410:
                    rv = None
                    continue
                if e.status and e.status < 500 and e.status != 429:
                    raise self._translate(e, where, kind) from None
                outage.wait(e, f"{e.status} {_api_message(e)}")
            except Unreachable as e:  # from the list call
                outage.wait(e, "no answer")
            except (urllib3.exceptions.HTTPError, OSError) as e:
                outage.wait(e, _short_reason(e))

    def _list_fn(self, kind: str, namespace: str) -> Callable[..., Any]:
        import functools

        if kind == "job":
            return functools.partial(
                self.custom.list_namespaced_custom_object,
                JOB_GROUP,
                JOB_VERSION,
                namespace,
                JOB_PLURAL,
            )
        if kind == "pod":
            return functools.partial(self.core.list_namespaced_pod, namespace)
        if kind == "event":
            return functools.partial(self.core.list_namespaced_event, namespace)
        raise ValueError(f"watch: unknown kind {kind!r}")


class _Outage:
    """Reconnect bookkeeping of one watch: back off while the API server is away, say so once,
    give up after RECONNECT_GIVE_UP_S (or at once if it never answered)."""

    def __init__(self, cluster: Cluster, where: str):
        self.cluster, self.where = cluster, where
        self.connected = False
        self.since: float | None = None
        self.tries = 0

    def over(self) -> None:
        self.connected = True
        if self.since is not None:
            took = time.monotonic() - self.since
            self.cluster.notice(f"{self.where}: reconnected after {took:.1f} s")
        self.since, self.tries = None, 0

    def wait(self, err: BaseException, reason: str) -> None:
        if not self.connected:
            raise (
                err if isinstance(err, ClusterError) else self.cluster._translate(err, self.where)
            ) from None
        now = time.monotonic()
        if self.since is None:
            self.since = now
            self.cluster.notice(f"{self.where}: lost the API server ({reason}); reconnecting...")
        elif now - self.since > RECONNECT_GIVE_UP_S:
            raise Unreachable(
                f"{self.where}: the API server at {self.cluster.server} has not answered for "
                f"{now - self.since:.0f} s (got {reason}). Check the cluster, then run the "
                "command again: the job itself is not affected"
            )
        time.sleep(RECONNECT_BACKOFF_S[min(self.tries, len(RECONNECT_BACKOFF_S) - 1)])
        self.tries += 1


class LogStreamBroken(Exception):
    """A followed log stream could not be opened or broke off; the follower re-attaches."""


class LogStream:
    """One open ``kubectl logs -f --timestamps`` stream; iterate for lines, ``close()`` to stop."""

    def __init__(self, resp: Any):
        self._resp = resp

    def __iter__(self) -> Iterator[str]:
        import urllib3
        from kubernetes.watch.watch import iter_resp_lines

        try:
            yield from iter_resp_lines(self._resp)
        except (urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError) as e:
            raise LogStreamBroken(_short_reason(e)) from None

    def close(self) -> None:
        """Stop the stream from another thread: shut the socket so a blocked read returns."""
        import socket

        with contextlib.suppress(Exception):
            sock = self._resp._fp.fp.raw._sock  # http.client -> socket (best effort)
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self._resp.close()


def _resync(
    known: dict[str, dict[str, Any]], items: list[dict[str, Any]]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """After a (re-)list: report what vanished as DELETED, then every current item."""
    current = {o.get("metadata", {}).get("uid", ""): o for o in items}
    for uid in [u for u in known if u not in current]:
        yield "DELETED", known.pop(uid)
    for uid, obj in current.items():
        etype = "MODIFIED" if uid in known else "ADDED"
        known[uid] = obj
        yield etype, obj


def _api_message(exc: Any) -> str:
    """The ``message`` of the API's Status body, else the HTTP reason."""
    body = getattr(exc, "body", None)
    if body:
        try:
            data = json.loads(body)
            if isinstance(data, dict) and data.get("message"):
                return str(data["message"])
        except (ValueError, TypeError):
            text = body.decode() if isinstance(body, bytes) else str(body)
            return text.strip()[:300]
    return str(getattr(exc, "reason", "") or exc)


def _details(exc: Any) -> dict[str, Any]:
    """The ``details`` of the API's Status body ({} if none)."""
    try:
        data = json.loads(exc.body or "{}")
    except (ValueError, TypeError):
        return {}
    return (data.get("details") or {}) if isinstance(data, dict) else {}


def _crd_missing(exc: Any) -> bool:
    """404 for the whole resource type (no CRD) rather than for one named object."""
    try:
        data = json.loads(exc.body or "{}")
    except (ValueError, TypeError):
        return True
    details = data.get("details") or {}
    return not details.get("name")


def _short_reason(exc: BaseException) -> str:
    """One line for a connection error: urllib3 nests the real cause several levels deep."""
    seen = exc
    reason = getattr(seen, "reason", None)
    while isinstance(reason, BaseException):
        seen, reason = reason, getattr(reason, "reason", None)
    text = str(seen)
    if "Connection refused" in text:
        return "connection refused"
    if "timed out" in text.lower():
        return "timed out"
    text = text.split(": ", 1)[-1] if "object at 0x" in text else text
    return text.strip()[:160] or type(exc).__name__
