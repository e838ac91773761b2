"""HTTP to the API server: a kubeconfig (or a pod's service account) made into one urllib3 pool.

ddpjob speaks JSON dicts on raw API paths, so it needs none of the ``kubernetes`` client's
generated models and API classes, and importing that package costs about half a second (its
~800 model modules), as long as a whole ``logs -f`` of a short log. Here, only urllib3 and PyYAML
are imported: a ``status`` or ``logs`` starts in a tenth of that.

The kubeconfig shapes kubectl users have on a laptop are read here: the files that ``KUBECONFIG``
lists, merged as kubectl merges them; a context, its cluster and its user; a CA file or CA data,
``insecure-skip-tls-verify``, ``tls-server-name``; client certificate and key (files or data),
``token``, ``tokenFile``, ``username``/``password``. A user whose credentials come from a
program (``exec``: EKS, GKE, AKS, OIDC logins) or an ``auth-provider`` is loaded by the
``kubernetes`` client's own loader (the import is paid only then), and its configuration, with
its token refresh, drives the same pool. Inside a pod, the service account's token (re-read as
the kubelet rotates it) and CA.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import urllib3

from controller.kube import tally

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# A rotated service account token is re-read at most this often (the kubernetes client: 60 s).
TOKEN_REREAD_S = 60.0
# Connections kept per host: a follower holds a pod watch and a log stream or two at once.
POOL_MAXSIZE = 16


class ConfigError(Exception):
    """The kubeconfig cannot be used: ``missing``, or unreadable, or naming what it does not
    hold."""

    def __init__(self, message: str, *, missing: bool = False):
        super().__init__(message)
        self.missing = missing


class ApiError(Exception):
    """The API server answered with an HTTP error: ``status``, ``reason`` and the ``body``
    (a Status object, usually) for ``controller.kube.errors.translate``."""

    def __init__(self, status: int, reason: str, body: bytes, headers: Any = None):
        super().__init__(f"{status} {reason}")
        self.status, self.reason, self.body, self.headers = status, reason, body, headers


class Transport:
    """One API server: its address, a TLS context and a pool of connections, and how to
    authenticate (``auth()``: the Authorization header's value, or None for certificates)."""

    def __init__(
        self,
        host: str,
        context: ssl.SSLContext,
        *,
        auth: Callable[[], str | None] = lambda: None,
        verify: bool = True,
        server_hostname: str | None = None,
        namespace: str | None = None,
    ):
        self.host = host.rstrip("/")
        self.namespace = namespace  # the context's (or the pod's) namespace, if it names one
        self._auth = auth
        if not verify:
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        kwargs: dict[str, Any] = {"server_hostname": server_hostname} if server_hostname else {}
        # retries=1: fail fast while the API server is away (watches and log streams retry
        # on their own, with their own backoff).
        self.pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=POOL_MAXSIZE,
            retries=1,
            ssl_context=context,
            cert_reqs="CERT_REQUIRED" if verify else "CERT_NONE",
            **kwargs,
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        timeout: tuple[float, float | None],
        stream: bool = False,
    ) -> urllib3.BaseHTTPResponse:
        """``method path?query`` with ``body`` as JSON. ``stream``: the response is returned
        unread (the caller reads and closes it). An HTTP error raises :class:`ApiError`;
        connection errors are urllib3's."""
        tally.count(tally.request_kind(method, path, query), path)
        url = self.host + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        headers = {"Accept": "application/json, */*"}
        auth = self._auth()
        if auth:
            headers["Authorization"] = auth
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        resp = self.pool.request(
            method,
            url,
            body=data,
            headers=headers,
            timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]),
            preload_content=not stream,
        )
        if resp.status >= 400:
            err_body = resp.data if not stream else _drain(resp)
            err = ApiError(resp.status, resp.reason or "", err_body, resp.headers)
            if resp.status == 403:
                tally.refused(err_body)
            raise err
        return resp


def _drain(resp: urllib3.BaseHTTPResponse) -> bytes:
    try:
        return resp.read()
    finally:
        resp.release_conn()


# --------------------------------------------------------------------------------------------
# Loading


def connect(kubeconfig: str | None = None, context: str | None = None) -> Transport:
    """The API server of ``kubeconfig`` (else ``$KUBECONFIG``, else ``~/.kube/config``) and
    ``context`` (else its current context); inside a pod with neither, the service account's.
    Raises :class:`ConfigError`, or ImportError for a credential program without the
    kubernetes client."""
    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster()
    paths = _kubeconfig_paths(kubeconfig)
    merged = merge(paths)
    name = context or merged.get("current-context")
    if not name:
        raise ConfigError("it names no current-context; pass --context")
    ctx = _named(merged, "contexts", name, "context")
    cluster = _named(merged, "clusters", ctx.get("cluster"), "cluster")
    user = _named(merged, "users", ctx.get("user"), "user") if ctx.get("user") else {}
    if "exec" in user or "auth-provider" in user:
        return _by_kubernetes_client(kubeconfig, context, ctx.get("namespace"))
    return from_entries(cluster, user, namespace=ctx.get("namespace"))


def _kubeconfig_paths(kubeconfig: str | None) -> list[Path]:
    if kubeconfig:
        return [Path(kubeconfig).expanduser()]
    env = os.environ.get("KUBECONFIG")
    if env:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    return [Path("~/.kube/config").expanduser()]


def merge(paths: list[Path]) -> dict[str, Any]:
    """The kubeconfig files, merged as kubectl merges ``KUBECONFIG``'s list: the first file
    that names a cluster, user or context wins it, and the first ``current-context`` set wins.
    Files that do not exist are skipped; each entry remembers its file (``_dir``) so relative
    paths in it resolve against that file's folder."""
    import yaml

    merged: dict[str, Any] = {"clusters": [], "users": [], "contexts": []}
    found = False
    for path in paths:
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        except OSError as e:
            raise ConfigError(f"{path}: {e.strerror or e}") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: not a kubeconfig (a {type(data).__name__})")
        found = True
        for key in ("clusters", "users", "contexts"):
            have = {e.get("name") for e in merged[key]}
            for entry in data.get(key) or []:
                if isinstance(entry, dict) and entry.get("name") not in have:
                    merged[key].append({**entry, "_dir": str(path.parent)})
                    have.add(entry.get("name"))
        if not merged.get("current-context") and data.get("current-context"):
            merged["current-context"] = data["current-context"]
    if not found:
        raise ConfigError(f"no such file {os.pathsep.join(map(str, paths))}", missing=True)
    return merged


def _named(merged: dict[str, Any], key: str, name: Any, field: str) -> dict[str, Any]:
    for entry in merged[key]:
        if entry.get("name") == name:
            body = entry.get(field) or {}
            return {**body, "_dir": entry["_dir"]}
    raise ConfigError(f"{key[:-1]} {name!r} is not in it")


def from_entries(
    cluster: dict[str, Any], user: dict[str, Any], namespace: str | None = None
) -> Transport:
    """A transport from a kubeconfig's ``cluster`` and ``user`` entries (as written there)."""
    server = cluster.get("server")
    if not server:
        raise ConfigError("its cluster has no server")
    verify = not cluster.get("insecure-skip-tls-verify", False)
    context = _tls_context(
        verify,
        ca=_file_or_data(cluster, "certificate-authority"),
        cert=_file_or_data(user, "client-certificate"),
        key=_file_or_data(user, "client-key"),
    )
    return Transport(
        server,
        context,
        auth=_user_auth(user),
        verify=verify,
        server_hostname=cluster.get("tls-server-name"),
        namespace=namespace,
    )


def _file_or_data(entry: dict[str, Any], field: str) -> bytes | None:
    """``field-data`` (base64) or the file ``field`` names (relative to its kubeconfig)."""
    data = entry.get(f"{field}-data")
    if data:
        try:
            return base64.b64decode("".join(str(data).split()), validate=True)
        except ValueError:
            raise ConfigError(f"{field}-data is not base64") from None
    name = entry.get(field)
    if not name:
        return None
    path = Path(entry.get("_dir", ".")) / Path(name).expanduser()
    try:
        return path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{field} {path}: {e.strerror or e}") from None


def _user_auth(user: dict[str, Any]) -> Callable[[], str | None]:
    token = user.get("token")
    if token:
        return lambda: f"Bearer {token}"
    if user.get("tokenFile"):
        path = Path(user.get("_dir", ".")) / Path(user["tokenFile"]).expanduser()
        return _TokenFile(path)
    if user.get("username") is not None and user.get("password") is not None:
        pair = f"{user['username']}:{user['password']}".encode()
        basic = f"Basic {base64.b64encode(pair).decode()}"
        return lambda: basic
    return lambda: None


class _TokenFile:
    """A bearer token read from a file, again at most every TOKEN_REREAD_S (it rotates)."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._token, self._read_at = self._read(), time.monotonic()

    def _read(self) -> str:
        try:
            return self.path.read_text().strip()
        except OSError as e:
            raise ConfigError(f"token file {self.path}: {e.strerror or e}") from None

    def __call__(self) -> str:
        with self._lock:
            if time.monotonic() - self._read_at > TOKEN_REREAD_S:
                with contextlib.suppress(ConfigError):  # keep the last one meanwhile
                    self._token = self._read()
                self._read_at = time.monotonic()
            return f"Bearer {self._token}"


def _tls_context(
    verify: bool, *, ca: bytes | None, cert: bytes | None, key: bytes | None
) -> ssl.SSLContext:
    """A TLS context that trusts ``ca`` (else the system's CAs) and presents ``cert``/``key``.
    The certificate and key are loaded from a private temporary folder that is removed at once:
    the context keeps them, nothing stays on disk."""
    from urllib3.util.ssl_ import create_urllib3_context

    ctx = create_urllib3_context()
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif ca:
        try:
            ctx.load_verify_locations(cadata=ca.decode(errors="replace"))
        except ssl.SSLError as e:
            raise ConfigError(
                f"certificate-authority: not a PEM certificate ({e.reason})"
            ) from None
    else:
        ctx.load_default_certs()
    if cert and key:
        with tempfile.TemporaryDirectory(prefix="ddpjob-tls-") as tmp:
            cert_path, key_path = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
            for path, content in ((cert_path, cert), (key_path, key)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(content)
            try:
                ctx.load_cert_chain(cert_path, key_path)
            except ssl.SSLError as e:
                raise ConfigError(
                    f"client-certificate/client-key: not a PEM pair ({e.reason})"
                ) from None
    elif cert or key:
        raise ConfigError("its user has a client-certificate or a client-key, not both")
    return ctx


def in_cluster() -> Transport:
    """Inside a pod: the API server's service address, the service account's CA and token."""
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:  # IPv6
        host = f"[{host}]"
    try:
        ca = (SERVICE_ACCOUNT / "ca.crt").read_bytes()
        namespace = (SERVICE_ACCOUNT / "namespace").read_text().strip() or None
    except OSError as e:
        raise ConfigError(f"in-cluster: {e.filename}: {e.strerror}") from None
    return Transport(
        f"https://{host}:{port}",
        _tls_context(True, ca=ca, cert=None, key=None),
        auth=_TokenFile(SERVICE_ACCOUNT / "token"),
        namespace=namespace,
    )


def _by_kubernetes_client(
    kubeconfig: str | None, context: str | None, namespace: str | None
) -> Transport:
    """A user with ``exec`` or ``auth-provider``: the kubernetes client's loader runs the
    program (and again when its token expires); the pool uses what it configured."""
    from kubernetes import client, config

    configuration = client.Configuration()

    def read(path: str | None) -> bytes | None:
        return Path(path).read_bytes() if path else None

    try:
        config.load_kube_config(
            config_file=kubeconfig,
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
        ca, cert, key = (
            read(configuration.ssl_ca_cert),
            read(configuration.cert_file),
            read(configuration.key_file),
        )
    except (config.ConfigException, OSError, ValueError) as e:
        raise ConfigError(str(e).strip() or type(e).__name__) from None
    tls = _tls_context(configuration.verify_ssl, ca=ca, cert=cert, key=key)
    return Transport(
        configuration.host,
        tls,
        auth=lambda: configuration.get_api_key_with_prefix("authorization"),
        verify=configuration.verify_ssl,
        server_hostname=getattr(configuration, "tls_server_name", None),
        namespace=namespace,
    )
