"""MLflow's REST API (``/api/2.0/mlflow/...``), the calls the tracker makes, over the standard
library's HTTP client.

The image talks to a tracking server through this, not through the ``mlflow`` package: the REST
API is the versioned contract every MLflow server speaks, and the slim client (mlflow-skinny)
would add about 60 MB and two dozen distributions to the image (FastAPI, uvicorn, OpenTelemetry,
the Databricks SDK, GitPython, ...) and 1.7 s of imports to rank 0. What MLflow's client reads
from the environment for an ``http(s)://`` tracking URI is read here the same way:
``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD`` (basic auth),
``MLFLOW_TRACKING_TOKEN`` (a bearer token), ``MLFLOW_TRACKING_INSECURE_TLS``,
``MLFLOW_TRACKING_SERVER_CERT_PATH`` (a CA bundle) and ``MLFLOW_TRACKING_CLIENT_CERT_PATH``.

Every call has a timeout and raises :class:`MlflowError`; retrying is the caller's to decide
(:attr:`MlflowError.retryable`).
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

#: MLflow's limits on one ``runs/log-batch`` request (``mlflow.utils.validation``).
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_KEY_LENGTH = 250
MAX_PARAM_VALUE_LENGTH = 6000
MAX_TAG_VALUE_LENGTH = 8000
#: Seconds one request may take, connect and answer.
TIMEOUT_S = 10.0
#: Run statuses (``RunStatus``).
RUNNING, FINISHED, FAILED, KILLED = "RUNNING", "FINISHED", "FAILED", "KILLED"


class MlflowError(Exception):
    """A call that failed: ``status`` (None: no answer), MLflow's ``code`` (e.g.
    ``RESOURCE_DOES_NOT_EXIST``) and whether trying again later may help."""

    def __init__(self, what: str, status: int | None = None, code: str | None = None):
        super().__init__(what)
        self.status, self.code = status, code

    @property
    def retryable(self) -> bool:
        """No answer, too many requests, or the server's own failure."""
        return self.status is None or self.status == 429 or self.status >= 500

    @property
    def not_found(self) -> bool:
        return self.code == "RESOURCE_DOES_NOT_EXIST" or self.status == 404


def is_http(uri: str) -> bool:
    """Whether ``uri`` is a tracking server this client can talk to."""
    return urllib.parse.urlsplit(uri).scheme in ("http", "https")


class MlflowClient:
    """The REST calls on the server at ``uri`` (``http(s)://host[:port][/prefix]``), with the
    credentials and TLS settings of ``environ`` (MLflow's own variables)."""

    def __init__(self, uri: str, environ: Mapping[str, str], timeout_s: float = TIMEOUT_S):
        self.uri = uri.rstrip("/")
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json", "User-Agent": "ddpjob-trainer"}
        user, password = (
            environ.get("MLFLOW_TRACKING_USERNAME"),
            environ.get("MLFLOW_TRACKING_PASSWORD"),
        )
        if user and password:
            basic = base64.b64encode(f"{user}:{password}".encode()).decode()
            self.headers["Authorization"] = f"Basic {basic}"
        elif environ.get("MLFLOW_TRACKING_TOKEN"):
            self.headers["Authorization"] = f"Bearer {environ['MLFLOW_TRACKING_TOKEN']}"
        self.context = _tls(environ) if self.uri.startswith("https:") else None

    # -- the calls ------------------------------------------------------------------------------

    def experiment_id(self, name: str) -> str:
        """The id of the experiment ``name``, created if missing (by another process meanwhile
        too: then it is read again)."""
        try:
            found = self._call("GET", "experiments/get-by-name", {"experiment_name": name})
            return found["experiment"]["experiment_id"]
        except MlflowError as e:
            if not e.not_found:
                raise
        try:
            return self._call("POST", "experiments/create", {"name": name})["experiment_id"]
        except MlflowError as e:
            if e.code != "RESOURCE_ALREADY_EXISTS":
                raise
        found = self._call("GET", "experiments/get-by-name", {"experiment_name": name})
        return found["experiment"]["experiment_id"]

    def create_run(
        self, experiment_id: str, run_name: str | None, start_ms: int, tags: Mapping[str, str]
    ) -> str:
        body: dict[str, Any] = {
            "experiment_id": experiment_id,
            "start_time": start_ms,
            "tags": [{"key": k, "value": v} for k, v in tags.items()],
        }
        if run_name:
            body["run_name"] = run_name
        return self._call("POST", "runs/create", body)["run"]["info"]["run_id"]

    def get_run(self, run_id: str) -> dict[str, Any]:
        """The run: ``info`` (status, lifecycle_stage, experiment_id) and ``data`` (its latest
        metrics, each with its step; params; tags)."""
        return self._call("GET", "runs/get", {"run_id": run_id})["run"]

    def log_batch(
        self,
        run_id: str,
        metrics: list[dict[str, Any]] = (),  # type: ignore[assignment]
        params: Mapping[str, str] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        """Metrics (``{"key", "value", "timestamp", "step"}``), params and tags in one request
        (within MLflow's limits: the caller batches)."""
        body = {
            "run_id": run_id,
            "metrics": list(metrics),
            "params": [{"key": k, "value": v} for k, v in (params or {}).items()],
            "tags": [{"key": k, "value": v} for k, v in (tags or {}).items()],
        }
        self._call("POST", "runs/log-batch", body)

    def update_run(self, run_id: str, status: str, end_ms: int | None = None) -> None:
        body: dict[str, Any] = {"run_id": run_id, "status": status}
        if end_ms is not None:
            body["end_time"] = end_ms
        self._call("POST", "runs/update", body)

    def run_url(self, experiment_id: str, run_id: str) -> str:
        """The run's page in the server's UI."""
        return f"{self.uri}/#/experiments/{experiment_id}/runs/{run_id}"

    # -- inside --------------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        url = f"{self.uri}/api/2.0/mlflow/{path}"
        data = None
        if method == "GET":
            url += "?" + urllib.parse.urlencode(body)
        else:
            data = json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, headers=self.headers, method=method)
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout_s, context=self.context
            ) as resp:
                text = resp.read()
        except urllib.error.HTTPError as e:
            raise _answer_error(path, e) from None
        except (OSError, ValueError) as e:  # refused, unreachable, timed out, TLS, a bad URL
            raise MlflowError(f"{path}: no answer from {self.uri} ({_reason(e)})") from None
        return json.loads(text) if text.strip() else {}


def _answer_error(path: str, e: urllib.error.HTTPError) -> MlflowError:
    try:
        answer = json.loads(e.read() or b"{}")
    except (ValueError, OSError):
        answer = {}
    code = answer.get("error_code") if isinstance(answer, dict) else None
    message = answer.get("message") if isinstance(answer, dict) else None
    what = f"{path}: {e.code} {code or e.reason}: {message or ''}".strip()
    return MlflowError(what, e.code, code)


def _reason(e: BaseException) -> str:
    reason = getattr(e, "reason", None)
    return str(reason if reason is not None else e) or type(e).__name__


def _tls(environ: Mapping[str, str]) -> ssl.SSLContext:
    """The TLS context MLflow's variables ask for."""
    insecure = environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() in ("true", "1")
    if insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(cafile=environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH"))
    if environ.get("MLFLOW_TRACKING_CLIENT_CERT_PATH"):
        context.load_cert_chain(environ["MLFLOW_TRACKING_CLIENT_CERT_PATH"])
    return context
