"""The local cluster's MLflow tracking server: the ``mlflow`` package's own server (``mlflow
server``, from the project's venv: ``make venv`` installs it from the lock) with a SQLite
backend, a host process whose files live under the state folder (``.cluster/mlflow/``, which
``down`` removes).

- Address: the node's bridge gateway at the fixed port :data:`PORT` (``gateway.py``): a spec's
  ``MLFLOW_TRACKING_URI`` names :data:`ENDPOINT` (the Service ``mlflow`` in ``ddpjob-system``),
  the host uses :data:`HOST_ENDPOINT`. MLflow answers only the Host headers it is told of
  (``--allowed-hosts``: its guard against DNS rebinding), so those two are named.
- One server process (``--workers 1``) and no job runner (``MLFLOW_SERVER_ENABLE_JOB_EXECUTION``
  off: MLflow's GenAI job queue starts seven consumer processes of its own, 160 MiB each).

:func:`server_argv` and :func:`server_env` are the command a test starts on the host too.
The server listens on the node's bridge: it runs with the real node only (:data:`ENABLED`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from ..controlplane.context import Component, http_get
from ..node import host
from . import gateway

if TYPE_CHECKING:
    from ..controlplane.context import Context

ENABLED = host.ENABLED
#: MLflow's own default port; fixed (``gateway.py``).
PORT = 5000
NAMESPACE = "ddpjob-system"
SERVICE = "mlflow"
DNS = f"{SERVICE}.{NAMESPACE}.svc"
ENDPOINT = f"http://{DNS}:{PORT}"
HOST_ENDPOINT = f"http://{host.GATEWAY}:{PORT}"


def data_dir(state_dir: Path) -> Path:
    """Everything the server keeps: ``mlflow.db`` and ``artifacts/``."""
    return state_dir / "mlflow"


def server_argv(folder: Path, address: str, port: int, hosts: tuple[str, ...]) -> list[str]:
    """``mlflow server`` of this environment, its store in ``folder``, answering the Host
    headers ``hosts`` on ``address:port``."""
    return [
        str(Path(sys.executable).with_name("mlflow")),
        "server",
        *("--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}"),
        *("--default-artifact-root", str(folder / "artifacts")),
        *("--host", address),
        *("--port", str(port)),
        *("--workers", "1"),
        *("--allowed-hosts", ",".join(hosts)),
    ]


def server_env(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` for the server: no job runner, no telemetry of MLflow's own."""
    return {
        **environ,
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }


def preflight(repo: Path) -> None:
    """One line when something else on this machine holds :data:`PORT` on every address."""
    if ENABLED:
        gateway.check_port(PORT, "MLflow server")


def objects() -> list[dict]:
    """The Service pods name the server by, and its EndpointSlice to the gateway."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    return [namespace, *gateway.service(SERVICE, NAMESPACE, "http", PORT)]


def apply_objects(ctx: Context) -> None:
    ctx.apply("\n---\n".join(yaml.safe_dump(o) for o in objects()))


def prepare(ctx: Context) -> None:
    (data_dir(ctx.state_dir) / "artifacts").mkdir(parents=True, exist_ok=True)


def argv(ctx: Context) -> list[str]:
    hosts = (f"{DNS}:{PORT}", f"{host.GATEWAY}:{PORT}")
    return server_argv(data_dir(ctx.state_dir), host.GATEWAY, PORT, hosts)


def env(ctx: Context) -> dict[str, str]:
    from ..procs import base_env

    return server_env(base_env())


def ready(ctx: Context) -> bool:
    return http_get(f"{HOST_ENDPOINT}/health").strip() == "OK"


#: Its imports take most of a minute on a loaded 2-core machine.
MLFLOW = Component("mlflow", argv, ready, env=env, prepare=prepare, timeout_s=180)
